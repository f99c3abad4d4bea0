# shellcheck shell=bash
#
# Helpers shared by scripts/quickstart and scripts/test. Source this file; don't run it.
#
# Each `ensure_*` function checks first and installs only what is missing, so a second run
# of a script on the same machine does no installing at all. Installing uses apt and works
# on Debian and Ubuntu only; elsewhere the functions say what to install and stop.
#
# Sourcing it also exports CARGO_TARGET_DIR (under the GPUlayer cache dir unless already
# set), so fresh clones of the repository reuse one build instead of compiling from zero.

# The repository this file belongs to (scripts/..).
GPULAYER_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# Prints "==> msg" to stderr.
log() {
    printf '==> %s\n' "$*" >&2
}

# Prints "error: msg" to stderr and exits 1.
die() {
    printf 'error: %s\n' "$*" >&2
    exit 1
}

# Where builds, the test venv and the pip cache live between runs.
gpulayer_cache_dir() {
    printf '%s\n' "${GPULAYER_CACHE_DIR:-$HOME/.cache/gpulayer}"
}

CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$(gpulayer_cache_dir)/target}"
export CARGO_TARGET_DIR

# Sets SUDO to "" when running as root, to "sudo" when sudo works; dies otherwise, saying
# what root was wanted for ($1, e.g. "installing curl"). sudo may ask for a password only
# when there is a terminal to ask on.
need_root_or_sudo() {
    local why="${1:-installing system packages}"
    if [[ $(id -u) -eq 0 ]]; then
        SUDO=""
        return 0
    fi
    if [[ ${SUDO:-} == sudo ]]; then
        return 0
    fi
    if ! command -v sudo >/dev/null 2>&1; then
        die "$why needs root, and sudo is not installed; run this script as root, or do that yourself and run it again"
    fi
    if sudo -n true 2>/dev/null || { [[ -t 0 ]] && sudo -v; }; then
        SUDO="sudo"
    else
        die "$why needs root, and sudo did not work here (no terminal to ask for a password, or not allowed); run this script as root, or do that yourself and run it again"
    fi
}

# Runs "$@" as root: directly when we are root, through sudo otherwise.
as_root() {
    need_root_or_sudo
    if [[ -n $SUDO ]]; then
        "$SUDO" "$@"
    else
        "$@"
    fi
}

# Whether this is Debian, Ubuntu or a derivative with apt and dpkg.
is_debian_like() {
    [[ -r /etc/os-release ]] || return 1
    command -v apt-get >/dev/null 2>&1 || return 1
    command -v dpkg-query >/dev/null 2>&1 || return 1
    local id="" id_like=""
    # shellcheck disable=SC1091
    id="$(. /etc/os-release && printf '%s' "${ID:-}")"
    # shellcheck disable=SC1091
    id_like="$(. /etc/os-release && printf '%s' "${ID_LIKE:-}")"
    [[ " $id $id_like " == *" debian "* || " $id $id_like " == *" ubuntu "* ]]
}

# `apt-get update` at most once per script run: the first install pays for it, later ones don't.
_GPULAYER_APT_UPDATED=0
apt_update_once() {
    if [[ $_GPULAYER_APT_UPDATED -eq 0 ]]; then
        log "apt-get update"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q
        _GPULAYER_APT_UPDATED=1
    fi
}

# Whether the Debian package is installed (per dpkg, not per what is on PATH).
apt_package_installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# Whether apt knows an installable version of the package.
apt_package_available() {
    local candidate
    candidate="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ { print $2 }')"
    [[ -n $candidate && $candidate != "(none)" ]]
}

# ensure_apt_packages PKG...: installs the Debian packages that are not installed yet.
ensure_apt_packages() {
    local missing=() pkg
    if ! is_debian_like; then
        # Without dpkg we cannot tell what is installed: name everything.
        log "this is not Debian or Ubuntu, so this script cannot install packages itself."
        log "install these (Debian names; use your system's equivalents) and run it again: $*"
        exit 1
    fi
    for pkg in "$@"; do
        apt_package_installed "$pkg" || missing+=("$pkg")
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        return 0
    fi
    need_root_or_sudo "installing ${missing[*]}"
    log "installing ${missing[*]}"
    apt_update_once
    as_root env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}"
}

# ensure_command CMD PKG: installs Debian package PKG when CMD is not on PATH.
ensure_command() {
    command -v "$1" >/dev/null 2>&1 || ensure_apt_packages "$2"
}

# A C toolchain and pkg-config for crates with build scripts.
ensure_build_tools() {
    if command -v cc >/dev/null 2>&1 && command -v make >/dev/null 2>&1 \
        && command -v pkg-config >/dev/null 2>&1; then
        return 0
    fi
    ensure_apt_packages build-essential pkg-config
}

# Prints the directory holding initdb, pg_ctl and postgres, or fails: the one pg_ctl on PATH
# lives in (following symlinks, as Debian links them into /usr/local/bin or similar), else
# the newest /usr/lib/postgresql/*/bin.
find_postgres_bindir() {
    local pg_ctl dir
    pg_ctl="$(command -v pg_ctl 2>/dev/null || true)"
    if [[ -n $pg_ctl ]] && command -v initdb >/dev/null 2>&1; then
        dir="$(dirname "$(readlink -f "$pg_ctl")")"
        if [[ -x $dir/initdb && -x $dir/postgres ]]; then
            printf '%s\n' "$dir"
            return 0
        fi
    fi
    while IFS= read -r dir; do
        if [[ -x $dir/initdb && -x $dir/pg_ctl && -x $dir/postgres ]]; then
            printf '%s\n' "$dir"
            return 0
        fi
    done < <(compgen -G '/usr/lib/postgresql/*/bin' | sort -rV)
    return 1
}

# PostgreSQL server binaries (initdb, pg_ctl). GPUlayer runs its own private cluster from
# them; it never uses the system cluster. Installing Debian's `postgresql` may create and
# start a `main` cluster on port 5432; that one is left alone.
# Afterwards initdb and pg_ctl are on PATH.
ensure_postgres_binaries() {
    local dir
    if ! dir="$(find_postgres_bindir)"; then
        log "PostgreSQL server binaries (initdb, pg_ctl) not found; installing Debian's postgresql"
        ensure_apt_packages postgresql
        dir="$(find_postgres_bindir)" \
            || die "installed postgresql, but still found no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin"
    fi
    local on_path
    on_path="$(command -v pg_ctl 2>/dev/null || true)"
    if [[ -z $on_path || "$(dirname "$(readlink -f "$on_path")")" != "$dir" ]] \
        || ! command -v initdb >/dev/null 2>&1; then
        export PATH="$dir:$PATH"
    fi
    log "PostgreSQL server binaries: $dir"
}

# The oldest Rust the workspace builds with (rust-version in the root Cargo.toml).
workspace_rust_version() {
    sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' "$GPULAYER_REPO_ROOT/Cargo.toml" 2>/dev/null | head -n 1
}

# cargo and rustc on PATH, new enough for the workspace. Uses an existing rustup install in
# ~/.cargo first, then Debian's `rustup` package where the release has one. Toolchains come
# from static.rust-lang.org, so a machine that cannot reach it needs Rust installed already.
ensure_rust() {
    local cargo_bin="${CARGO_HOME:-$HOME/.cargo}/bin"
    if ! command -v cargo >/dev/null 2>&1 && [[ -x $cargo_bin/cargo ]]; then
        export PATH="$cargo_bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        if ! command -v rustup >/dev/null 2>&1; then
            if is_debian_like; then
                apt_update_once
                if apt_package_available rustup; then
                    ensure_apt_packages rustup
                fi
            fi
        fi
        if command -v rustup >/dev/null 2>&1; then
            log "installing the stable Rust toolchain with rustup"
            rustup default stable \
                || die "rustup could not install the stable toolchain (it downloads from static.rust-lang.org); install Rust from https://rustup.rs and run this again"
            [[ -d $cargo_bin ]] && export PATH="$cargo_bin:$PATH"
        fi
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        die "cargo not found, and no rustup to install it with (this OS has no rustup package); install Rust from https://rustup.rs (or your OS's rustup package) and run this again"
    fi
    local want have
    want="$(workspace_rust_version)"
    have="$(rustc --version 2>/dev/null | awk '{ print $2 }')"
    have="${have%%-*}"
    if [[ -n $want && -n $have ]] \
        && [[ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n 1)" != "$want" ]]; then
        die "rustc $have is older than the $want this workspace needs; run 'rustup update stable' (or install a newer Rust) and run this again"
    fi
    # `cargo install` puts binaries here; make them findable.
    if [[ -d $cargo_bin && ":$PATH:" != *":$cargo_bin:"* ]]; then
        export PATH="$PATH:$cargo_bin"
    fi
    log "Rust: $(cargo --version)"
}

# cargo-nextest, built from crates.io when missing (a few minutes, once per machine).
ensure_nextest() {
    if cargo nextest --version >/dev/null 2>&1; then
        return 0
    fi
    log "installing cargo-nextest from crates.io (builds from source; takes a few minutes once)"
    # Its own scratch target dir, not the workspace's shared one.
    env -u CARGO_TARGET_DIR cargo install cargo-nextest --locked
    cargo nextest --version >/dev/null 2>&1 \
        || die "cargo-nextest was installed but 'cargo nextest' still fails; is ${CARGO_HOME:-$HOME/.cargo}/bin on PATH?"
}

# ensure_rust_components NAME...: rustup components such as rustfmt and clippy, when cargo
# lacks the matching subcommand (`cargo fmt`, `cargo clippy`) and rustup can add it.
ensure_rust_components() {
    local component subcommand
    for component in "$@"; do
        subcommand="${component/rustfmt/fmt}"
        if cargo "$subcommand" --version >/dev/null 2>&1; then
            continue
        fi
        command -v rustup >/dev/null 2>&1 \
            || die "'cargo $subcommand' is missing and there is no rustup to add $component with; install it with your Rust toolchain"
        log "adding the $component component"
        rustup component add "$component"
    done
}
