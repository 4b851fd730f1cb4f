#!/usr/bin/env bash
# `make test-docker`: the image built, started and used as a user would (tests/packaging/test_docker_image.py,
# pytest -m docker). Needs a Docker engine, debootstrap (the stand-in base where no image registry
# is reachable) and Docker Compose. As root, whatever is missing is installed from Debian's
# packages and dockerd is started (and stopped again at the end); otherwise one line says what
# is missing and the target fails.
#   scripts/docker-test.sh [PYTHON] [pytest args...]
set -euo pipefail
py="${1:-.venv/bin/python}"
shift || true
root=0; [ "$(id -u)" = 0 ] && root=1

have() { command -v "$1" >/dev/null || [ -x "/usr/sbin/$1" ]; }
missing=()
have dockerd || docker info >/dev/null 2>&1 || missing+=(docker.io)
have debootstrap || missing+=(debootstrap)
docker compose version >/dev/null 2>&1 || have docker-compose || missing+=(docker-compose)
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$root" = 0 ]; then
    echo "make test-docker: missing ${missing[*]} (Debian packages); install them as root (scripts/install.sh --dev does), then run it again" >&2
    exit 1
  fi
  echo "make test-docker: installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

started=""
if ! docker info >/dev/null 2>&1; then
  if [ "$root" = 0 ]; then
    why="$(docker info 2>&1 >/dev/null | grep -m1 -i -E 'denied|cannot connect|error' || true)"
    echo "make test-docker: no Docker engine answers $(id -un) (${why:-docker info failed}); only root can start dockerd here: start it (or join the docker group), then run it again" >&2
    exit 1
  fi
  # No iptables and no default bridge on these machines: the tests publish ports on a network
  # of their own (ports go through docker-proxy) and build with --network host.
  log="${TMPDIR:-/tmp}/attnviz-dockerd.log"
  echo "make test-docker: starting dockerd ${DOCKERD_FLAGS:=--iptables=false --bridge=none} (log: $log)"
  # shellcheck disable=SC2086 # the flags are words
  PATH="$PATH:/usr/sbin" setsid dockerd $DOCKERD_FLAGS </dev/null >"$log" 2>&1 &
  started=$!
  for _ in $(seq 1 120); do
    docker info >/dev/null 2>&1 && break
    kill -0 "$started" 2>/dev/null || { tail -20 "$log" >&2; echo "make test-docker: dockerd exited" >&2; exit 1; }
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { tail -20 "$log" >&2; echo "make test-docker: dockerd did not answer in 60 s" >&2; exit 1; }
fi

stop_engine() {
  if [ -n "$started" ]; then
    kill -TERM "$started" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$started" 2>/dev/null || return 0; sleep 0.5; done
    kill -KILL "$started" 2>/dev/null || true
  fi
}
trap stop_engine EXIT

t0=$(date +%s)
"$py" -m pytest -m docker "$@"
echo "make test-docker: $(( $(date +%s) - t0 )) s"
