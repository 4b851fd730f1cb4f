#!/usr/bin/env bash
# A stand-in for python:3.11-slim where no image registry can be reached: Debian bookworm's
# Python 3.11 made from Debian packages with debootstrap and `docker import` (about 2 minutes,
# once: an image with the same recipe is reused). Build the app on it with
#   scripts/docker-base.sh attnviz-base
#   docker build --network host --build-arg BASE_IMAGE=attnviz-base --build-arg TORCH=wheel -t attnviz .
# The image carries this machine's CA bundle (the one pip uses here) and the http(s) index settings
# of its pip configuration, so that a build reaches the package index the way this machine does;
# pip settings that name local folders (find-links, file:// indexes) are left out: TORCH=wheel and
# wheels/ are for those. Needs root (debootstrap) and a Docker engine.
set -euo pipefail
tag="${1:-attnviz-base}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

# The CA bundle and index settings pip uses on this machine (`pip config list`, PIP_* variables).
pip_settings() {
  python3 - <<'EOF'
import configparser, os, subprocess, sys
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
conf = {}
for line in out.splitlines():
    key, _, value = line.partition("=")
    name = key.split(".", 1)[-1].strip()
    conf[name] = value.strip().strip("'\"")
for name in ("cert", "index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout"):
    env = os.environ.get("PIP_" + name.upper().replace("-", "_"))
    if env:
        conf[name] = env
cert = conf.get("cert") or "/etc/ssl/certs/ca-certificates.crt"
print("cert", cert)
for name in ("index-url", "extra-index-url"):
    urls = [u for u in conf.get(name, "").split() if u.startswith(("http://", "https://"))]
    if urls:
        print(name, " ".join(urls))
for name in ("trusted-host",):
    if conf.get(name):
        print(name, conf[name])
timeout = conf.get("timeout") or conf.get("default-timeout")
if timeout:
    print("timeout", timeout)
EOF
}

settings="$(pip_settings)"
cert="$(sed -n 's/^cert //p' <<<"$settings")"
[ -r "$cert" ] || { echo "docker-base: the CA bundle $cert is not readable" >&2; exit 1; }
recipe="$(cat "$0" "$cert" <(printf '%s\n' "$settings" "$mirror") | sha256sum | cut -c1-16)"

if [ "$(docker image inspect --format '{{ index .Config.Labels "attnviz.base.recipe" }}' "$tag" 2>/dev/null)" = "$recipe" ]; then
  echo "docker-base: $tag is up to date (recipe $recipe)"
  exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v debootstrap >/dev/null; then
  echo "docker-base: building $tag needs root and debootstrap (apt-get install debootstrap)" >&2
  exit 1
fi

t0=$(date +%s)
root="$(mktemp -d "${TMPDIR:-/var/tmp}/attnviz-base.XXXXXX")"
trap 'rm -rf "$root"' EXIT
echo "docker-base: debootstrap bookworm (minbase + python3) from $mirror"
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$root" "$mirror" >"$root.log" 2>&1 || { tail -20 "$root.log" >&2; rm -f "$root.log"; exit 1; }
rm -f "$root.log"
# This machine's trust and pip settings; `python` as in the python images.
install -m 644 "$cert" "$root/etc/ssl/certs/ca-certificates.crt"
{
  echo "[global]"
  echo "cert = /etc/ssl/certs/ca-certificates.crt"
  sed -n -e 's/^\(index-url\|extra-index-url\|trusted-host\|timeout\) \(.*\)/\1 = \2/p' <<<"$settings"
} >"$root/etc/pip.conf"
ln -sf python3 "$root/usr/bin/python"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc "$root"/usr/share/man
tar -C "$root" -c . | docker import \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python3"]' \
  --change "LABEL attnviz.base.recipe=$recipe" \
  - "$tag" >/dev/null
size=$(docker image inspect --format '{{ .Size }}' "$tag")
echo "docker-base: built $tag in $(( $(date +%s) - t0 )) s, $(( size / 1000000 )) MB (recipe $recipe)"
