//! Placement questions answered from the database: who could run this job (at submit and in
//! a dry run), and why a pending job still waits.

use crate::auth::{Authorized, may};
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
        .map(view_of)
        .collect())
}

/// A worker's row as the scheduler sees it.
pub(crate) fn view_of(w: store::WorkerRow) -> WorkerView {
    WorkerView {
        id: WorkerId(w.id),
        online: w.state == "online",
        name: w.name,
        inventory: w.inventory,
        labels: w.labels,
        slots: w.slots,
        busy_slots: w.busy_slots,
        busy_devices: w.busy_devices,
    }
}

/// A gang's report: the scheduler's sentence on the gang as a whole, then every worker.
fn gang_report(why: &str, verdicts: &[Verdict], possible: bool) -> PlacementReport {
    let mut report = report(verdicts);
    if !possible {
        report.eligible_workers = 0;
    }
    // The per-worker lines, under the gang's own sentence instead of the count.
    let workers = report
        .table
        .split_once('\n')
        .map(|(_, rest)| rest.to_string())
        .unwrap_or_default();
    report.table = format!("scheduling: {why}\n{workers}");
    report
}

/// Whether the gang `spec` could ever run on these workers: None if so, else its report.
fn gang_refusal(workers: &[WorkerView], spec: &JobSpec) -> Option<PlacementReport> {
    match scheduler::place_gang(workers, spec, &[]) {
        scheduler::GangDecision::Unplaceable { verdicts, why } => {
            Some(gang_report(&why, &verdicts, false))
        }
        _ => None,
    }
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

/// Checks a spec (already checked on its own, see `jobs::accept`) against the online
/// workers. A job no online worker could ever run is refused with every worker's reason. With no worker
/// online at all the job is accepted: the first worker to join may take it.
pub(crate) async fn admit(app: &AppState, spec: &JobSpec) -> ApiResult<()> {
    let workers = worker_views(app).await?;
    let verdicts = scheduler::eligibility(&workers, spec);
    if verdicts.is_empty() {
        return Ok(());
    }
    if !scheduler::any_eligible(&verdicts) {
        return Err(ApiError::Unplaceable(report(&verdicts)));
    }
    if spec.layout.is_gang()
        && let Some(refusal) = gang_refusal(&workers, spec)
    {
        return Err(ApiError::Unplaceable(refusal));
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
        let needs = serde_json::to_string(&(&spec.accelerator, &spec.requirements, &spec.layout))
            .unwrap_or_default();
        if !seen.insert(needs) {
            continue;
        }
        let verdicts = scheduler::eligibility(&workers, spec);
        if verdicts.is_empty() {
            continue;
        }
        let refusal = if !scheduler::any_eligible(&verdicts) {
            Some(report(&verdicts))
        } else if spec.layout.is_gang() {
            gang_refusal(&workers, spec)
        } else {
            None
        };
        if let Some(mut report) = refusal {
            report.table = format!("job {}: {}", i + 1, report.table);
            return Err(ApiError::Unplaceable(report));
        }
    }
    Ok(())
}

/// Why a pending job is not running yet, worker by worker, counting what is busy; for a
/// gang, first what the gang as a whole waits for.
pub(crate) async fn waiting(
    app: &AppState,
    job_id: i64,
    spec: &JobSpec,
) -> ApiResult<PlacementReport> {
    let workers = worker_views(app).await?;
    let verdicts: Vec<Verdict> = workers
        .iter()
        .map(|w| Verdict {
            worker: w.name.clone(),
            reason: scheduler::fit_now(w, spec).err(),
        })
        .collect();
    if !spec.layout.is_gang() {
        return Ok(report(&verdicts));
    }
    let kept: Vec<WorkerId> = app
        .store
        .kept_for(job_id)
        .await?
        .into_iter()
        .map(WorkerId)
        .collect();
    let why = match scheduler::place_gang(&workers, spec, &kept) {
        scheduler::GangDecision::Place { why, .. } => format!("about to start: {why}"),
        scheduler::GangDecision::Reserve { why, .. } => why,
        scheduler::GangDecision::Unplaceable { why, .. } => why,
    };
    Ok(gang_report(&why, &verdicts, true))
}

/// A dry run: which online workers could run this spec, ignoring what is busy now. Nothing
/// is stored.
#[utoipa::path(post, path = "/v1/placement", request_body = SubmitRequest, responses((status = 200, body = PlacementReport), (status = 400, body = protocol::ErrorBody)))]
pub async fn dry_run(
    State(app): State<AppState>,
    _: Authorized<may::ReadJobs>,
    body: Result<Json<SubmitRequest>, JsonRejection>,
) -> ApiResult<Json<PlacementReport>> {
    let req = json_body(body)?;
    req.spec
        .check()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let workers = worker_views(&app).await?;
    let verdicts = scheduler::eligibility(&workers, &req.spec);
    if req.spec.layout.is_gang()
        && scheduler::any_eligible(&verdicts)
        && let Some(refusal) = gang_refusal(&workers, &req.spec)
    {
        return Ok(Json(refusal));
    }
    Ok(Json(report(&verdicts)))
}
