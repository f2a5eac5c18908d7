//! A throwaway PostgreSQL server on loopback, for tests and benchmarks (feature
//! `local-server`): `initdb` into a fresh directory, `pg_ctl start` on a free port of
//! 127.0.0.1, and `pg_ctl stop` plus removal of the directory when dropped. It only
//! starts and stops the server; the store never depends on it.
//!
//! The binaries are found in `$AGENTLOOP_PG_BIN`, else on `PATH`, else in the newest
//! `/usr/lib/postgresql/<version>/bin` (Debian's `postgresql` package). `initdb`
//! refuses to run as root, so as root the server runs as the `postgres` user (through
//! `runuser`) on a directory that user owns.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};

/// A running throwaway server. Stopped (immediately) and deleted when dropped.
pub struct LocalServer {
    dir: PathBuf,
    bin: PathBuf,
    port: u16,
    as_postgres: bool,
}

/// Why the server could not be started: says which step, and its output.
#[derive(Debug)]
pub struct LocalServerError(pub String);

impl std::fmt::Display for LocalServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LocalServerError {}

/// The directory of the PostgreSQL server's binaries (`initdb`, `pg_ctl`, `postgres`):
/// `$AGENTLOOP_PG_BIN`, else the one on `PATH` (through its symlink), else the newest
/// under Debian's `/usr/lib/postgresql/*/bin`. For tests that run a server of their own
/// beside [`LocalServer`] (the power-cut test puts its data directory on LazyFS).
pub fn find_bin() -> Result<PathBuf, LocalServerError> {
    if let Some(dir) = std::env::var_os("AGENTLOOP_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                // Through a symlink to the real directory, where the other tools are.
                let real = std::fs::canonicalize(dir.join("initdb"))
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf));
                return Ok(real.unwrap_or(dir));
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        LocalServerError(
            "no PostgreSQL server binaries (initdb, pg_ctl): install Debian's `postgresql` \
             package (`.ci/run` does), or set AGENTLOOP_PG_BIN to their directory"
                .into(),
        )
    })
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

fn free_port() -> Result<u16, LocalServerError> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| LocalServerError(format!("no free port on 127.0.0.1: {e}")))
}

impl LocalServer {
    /// Starts a server with `settings` (`name=value`, passed as `-c`) on top of
    /// defaults for a test: `fsync` stays on unless a setting turns it off. Blocks
    /// while the server starts (a second or two): call it before a runtime, or from
    /// `spawn_blocking`.
    pub fn start(settings: &[&str]) -> Result<Self, LocalServerError> {
        Self::start_with(settings, None)
    }

    /// [`LocalServer::start`] with TLS on (S43): `cert` (the server's chain) and `key`
    /// (its private key), both PEM, are written into the server's directory, readable
    /// by the server alone, and `ssl` is turned on with them.
    pub fn start_tls(cert: &str, key: &str, settings: &[&str]) -> Result<Self, LocalServerError> {
        Self::start_with(settings, Some((cert, key)))
    }

    fn start_with(settings: &[&str], tls: Option<(&str, &str)>) -> Result<Self, LocalServerError> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let bin = find_bin()?;
        let as_postgres = is_root();
        let dir = std::env::temp_dir().join(format!(
            "agentloop-pg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir)
            .map_err(|e| LocalServerError(format!("cannot create {}: {e}", dir.display())))?;
        let server = LocalServer {
            dir,
            bin,
            port: free_port()?,
            as_postgres,
        };
        let mut settings: Vec<String> = settings.iter().map(|s| s.to_string()).collect();
        if let Some((cert, key)) = tls {
            let write = |name: &str, text: &str| {
                let path = server.dir.join(name);
                std::fs::write(&path, text).map_err(|e| {
                    LocalServerError(format!("cannot write {}: {e}", path.display()))
                })?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt as _;
                    // PostgreSQL refuses a key others may read.
                    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                        .map_err(|e| {
                            LocalServerError(format!("cannot chmod {}: {e}", path.display()))
                        })?;
                }
                Ok::<String, LocalServerError>(path.display().to_string())
            };
            let cert = write("server.crt", cert)?;
            let key = write("server.key", key)?;
            settings.push("ssl=on".into());
            settings.push(format!("ssl_cert_file={cert}"));
            settings.push(format!("ssl_key_file={key}"));
        }
        if as_postgres {
            server.run(
                "chown",
                &["-R", "postgres:", &server.dir.display().to_string()],
                false,
            )?;
        }
        let data = server.data().display().to_string();
        server.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "agentloop",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--no-instructions",
            ],
            true,
        )?;
        let mut options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
            server.port,
            server.dir.display()
        );
        for s in &settings {
            options.push_str(" -c ");
            options.push_str(s);
        }
        let log = server.dir.join("server.log").display().to_string();
        server.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-o", &options, "-w", "-t", "60", "start",
            ],
            true,
        )?;
        Ok(server)
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Runs a command (a PostgreSQL binary when `pg`), as `postgres` when root.
    fn run(&self, program: &str, args: &[&str], pg: bool) -> Result<(), LocalServerError> {
        let exe = if pg {
            self.bin.join(program)
        } else {
            PathBuf::from(program)
        };
        let mut cmd = if pg && self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args).current_dir(&self.dir);
        let out = cmd
            .output()
            .map_err(|e| LocalServerError(format!("cannot run {}: {e}", exe.display())))?;
        if out.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        Err(LocalServerError(format!(
            "{} {:?} failed ({}): {}{}\n{log}",
            exe.display(),
            args,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )))
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL for the server's `postgres` database as its superuser `agentloop`.
    pub fn url(&self) -> String {
        format!("postgresql://agentloop@127.0.0.1:{}/postgres", self.port)
    }

    /// A fresh database on the server (so tests sharing one server do not share
    /// records); its URL. Blocks.
    pub fn database(&self, name: &str) -> Result<String, LocalServerError> {
        let port = self.port.to_string();
        self.run(
            "createdb",
            &["-h", "127.0.0.1", "-p", &port, "-U", "agentloop", name],
            true,
        )?;
        Ok(format!(
            "postgresql://agentloop@127.0.0.1:{}/{name}",
            self.port
        ))
    }

    /// The server's directory (data and log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let data = self.data().display().to_string();
        if let Err(e) = self.run(
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "-w", "stop"],
            true,
        ) {
            tracing::warn!(error = %e, "could not stop the local PostgreSQL server");
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
