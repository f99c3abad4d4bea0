//! The private PostgreSQL cluster shared by one test run, and a fresh database per test.

use sqlx::postgres::PgConnectOptions;
use std::path::PathBuf;
use store::EmbeddedPostgres;
use tokio::sync::OnceCell;

/// A database of its own for one test.
#[derive(Debug, Clone)]
pub struct TestDatabase {
    pub name: String,
    /// A URL another process (a `gpulayer up --database-url`) can use.
    pub url: String,
    pub options: PgConnectOptions,
    pub cluster: EmbeddedPostgres,
}

static CLUSTER: OnceCell<EmbeddedPostgres> = OnceCell::const_new();

fn cluster_home() -> PathBuf {
    match std::env::var_os("GPULAYER_TEST_PGDATA") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::temp_dir().join(format!("gpulayer-testkit-{}", nix::unistd::getuid())),
    }
}

async fn cluster() -> &'static EmbeddedPostgres {
    CLUSTER
        .get_or_init(|| async {
            let home = cluster_home();
            std::fs::create_dir_all(&home).expect("create the test cluster's directory");
            // Under root the cluster runs as an unprivileged user, which must be able to enter
            // this directory (mktemp makes it 0700) or the cluster would be relocated.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755))
                .expect("open the test cluster's directory");
            // Test processes start together; one starts the cluster, the rest attach to it.
            let lock_path = home.join("start.lock");
            let lock_file = std::fs::File::create(&lock_path).expect("create the start lock");
            let lock = tokio::task::spawn_blocking(move || {
                nix::fcntl::Flock::lock(lock_file, nix::fcntl::FlockArg::LockExclusive)
                    .map_err(|(_, e)| e)
                    .expect("take the start lock")
            })
            .await
            .expect("lock task");
            let pg = EmbeddedPostgres::start(&home).await.unwrap_or_else(|e| {
                panic!(
                    "start the test PostgreSQL cluster in {}: {e}",
                    home.display()
                )
            });
            drop(lock);
            pg
        })
        .await
}

/// A new, empty database in the run's cluster, named after a random id.
pub async fn fresh_database() -> TestDatabase {
    let pg = cluster().await.clone();
    let name = format!("t_{}", uuid_like());
    pg.ensure_database(&name)
        .await
        .expect("create the test database");
    TestDatabase {
        url: pg.url(&name),
        options: pg.connect_options(&name),
        name,
        cluster: pg,
    }
}

fn uuid_like() -> String {
    use std::time::{SystemTime, UNIX_EPOCH};
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff_ffff)
}
