#!/usr/bin/env bash
# Checks the deployment files offline: the Kubernetes manifests against the API's schemas
# (kubernetes-validate, strict), KEDA's ScaledObject against its CRD's fields
# (deploy/k8s/schemas/scaledobject.json, check-jsonschema), HAProxy's config (haproxy -c), and
# that the Dockerfile builds what the repo has. The checkers come from PyPI into a venv under
# target/, pinned; installed once.
set -euo pipefail
cd "$(dirname "$0")/.."

venv=target/deploy-venv
if [ ! -x "$venv/bin/check-jsonschema" ] || [ ! -x "$venv/bin/kubernetes-validate" ]; then
  echo "deploy: installing kubernetes-validate and check-jsonschema (pip, into $venv)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    kubernetes-validate==1.37.0 check-jsonschema==0.39.0
fi

echo "deploy: Kubernetes manifests"
"$venv/bin/kubernetes-validate" --strict --quiet \
  deploy/k8s/deployment.yaml deploy/k8s/service.yaml deploy/k8s/pdb.yaml
echo "deploy: KEDA ScaledObject"
"$venv/bin/check-jsonschema" --schemafile deploy/k8s/schemas/scaledobject.json \
  deploy/k8s/keda-scaledobject.yaml

echo "deploy: HAProxy config"
VOXIDE_LB_BIND=127.0.0.1:8080 VOXIDE_AGENT_PORT=7870 VOXIDE_N1=127.0.0.11:7860 \
  VOXIDE_N2=127.0.0.12:7860 VOXIDE_N3=127.0.0.13:7860 \
  haproxy -c -q -f deploy/haproxy/haproxy.cfg

echo "deploy: Dockerfile"
# What it copies and runs exists, and the metric the autoscaler reads is one voxide exports.
for path in scripts/fetch_models.py assets/models.json Cargo.lock; do
  [ -e "$path" ] || { echo "deploy: the Dockerfile needs $path" >&2; exit 1; }
done
grep -q 'cargo build --profile dist --locked --bin voxide' Dockerfile
grep -q 'target/dist/voxide' Dockerfile
grep -q '^\[profile.dist\]' Cargo.toml
grep -q 'voxide_active_sessions' src/server/metrics.rs
grep -q 'voxide_active_sessions' deploy/k8s/keda-scaledobject.yaml
echo "deploy: all valid"
