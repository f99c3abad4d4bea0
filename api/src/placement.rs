//! Placement questions answered from the database: who could run this job (at submit and in
//! a dry run), and why a pending job still waits.

use crate::auth::{Caller, Permission};
use crate::error::{ApiError, ApiResult};
use crate::jobs::json_body;
use crate::server::AppState;
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use domain::{JobSpec, WorkerId};
use protocol::{PlacementReport, SubmitRequest, WorkerVerdict};
use scheduler::{Verdict, VerdictTable, WorkerView};

/// Every worker as the scheduler sees it now.
pub(crate) async fn worker_views(app: &AppState) -> ApiResult<Vec<WorkerView>> {
    Ok(app
        .store
        .list_workers()
        .await?
        .into_iter()
        .filter(|w| w.state != "stopped")
        .map(|w| WorkerView {
            id: WorkerId(w.id),
            online: w.state == "online",
            name: w.name,
            inventory: w.inventory,
            labels: w.labels,
            slots: w.slots,
            busy_slots: w.busy_slots,
            busy_devices: w.busy_devices,
        })
        .collect())
}

pub(crate) fn report(verdicts: &[Verdict]) -> PlacementReport {
    PlacementReport {
        eligible_workers: verdicts.iter().filter(|v| v.reason.is_none()).count(),
        verdicts: verdicts
            .iter()
            .map(|v| WorkerVerdict {
                worker: v.worker.clone(),
                eligible: v.reason.is_none(),
                reason: v.reason.as_ref().map(ToString::to_string),
                temporary: v
                    .reason
                    .as_ref()
                    .is_some_and(scheduler::Reason::is_temporary),
            })
            .collect(),
        table: VerdictTable(verdicts).to_string(),
    }
}

/// Checks a spec's parts against each other, then against the online workers. A job no
/// online worker could ever run is refused with every worker's reason. With no worker
/// online at all the job is accepted: the first worker to join may take it.
pub(crate) async fn admit(app: &AppState, spec: &JobSpec) -> ApiResult<()> {
    spec.check()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let workers = worker_views(app).await?;
    let verdicts = scheduler::eligibility(&workers, spec);
    if !verdicts.is_empty() && !scheduler::any_eligible(&verdicts) {
        return Err(ApiError::Unplaceable(report(&verdicts)));
    }
    Ok(())
}

/// Admits many specs at once: each checked on its own (errors name the job's position), and
/// each distinct set of needs checked against the workers once.
pub(crate) async fn admit_batch(app: &AppState, specs: &[JobSpec]) -> ApiResult<()> {
    for (i, spec) in specs.iter().enumerate() {
        spec.check()
            .map_err(|e| ApiError::BadRequest(format!("job {}: {e}", i + 1)))?;
    }
    let workers = worker_views(app).await?;
    let mut seen = std::collections::HashSet::new();
    for (i, spec) in specs.iter().enumerate() {
        let needs =
            serde_json::to_string(&(&spec.accelerator, &spec.requirements)).unwrap_or_default();
        if !seen.insert(needs) {
            continue;
        }
        let verdicts = scheduler::eligibility(&workers, spec);
        if !verdicts.is_empty() && !scheduler::any_eligible(&verdicts) {
            let mut report = report(&verdicts);
            report.table = format!("job {}: {}", i + 1, report.table);
            return Err(ApiError::Unplaceable(report));
        }
    }
    Ok(())
}

/// Why a pending job is not running yet, worker by worker, counting what is busy.
pub(crate) async fn waiting(app: &AppState, spec: &JobSpec) -> ApiResult<PlacementReport> {
    let workers = worker_views(app).await?;
    let verdicts: Vec<Verdict> = workers
        .iter()
        .map(|w| Verdict {
            worker: w.name.clone(),
            reason: scheduler::fit_now(w, spec).err(),
        })
        .collect();
    Ok(report(&verdicts))
}

/// A dry run: which online workers could run this spec, ignoring what is busy now. Nothing
/// is stored.
#[utoipa::path(post, path = "/v1/placement", request_body = SubmitRequest, responses((status = 200, body = PlacementReport), (status = 400, body = protocol::ErrorBody)))]
pub async fn dry_run(
    State(app): State<AppState>,
    caller: Caller,
    body: Result<Json<SubmitRequest>, JsonRejection>,
) -> ApiResult<Json<PlacementReport>> {
    caller.require(Permission::ReadJobs)?;
    let req = json_body(body)?;
    req.spec
        .check()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let workers = worker_views(&app).await?;
    Ok(Json(report(&scheduler::eligibility(&workers, &req.spec))))
}
