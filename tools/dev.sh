#!/usr/bin/env bash
# `make dev`: a local control plane, an S3 server, the operator, the example tool server, and the
# example approval run driven to Succeeded through `kubectl annotate ... approved=true`.
# Everything keeps running afterwards; `make dev-down` stops it all.
#   DEV_APPROVE=manual make dev   stops at AwaitingApproval and leaves the decision to you.
set -euo pipefail
cd "$(dirname "$0")/.."
DEV_DIR=${LOCALKUBE_DIR:-.localkube}
RUN=refund-42
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "control plane (etcd, kube-apiserver, kube-controller-manager, process kubelet)"
eval "$(python3 e2e/cluster.py up --dir "$DEV_DIR")"
say "S3 server"
eval "$(python3 e2e/cluster.py s3-up --dir "$DEV_DIR/s3")"
echo "export KUBECONFIG=$KUBECONFIG" > "$DEV_DIR/dev.env"
echo "export PATH=$(dirname "$(command -v kubectl)"):\$PATH" >> "$DEV_DIR/dev.env"

say "CRD, lap ServiceAccount, S3 credentials Secret"
kubectl apply -f crds/
kubectl wait --for=condition=Established crd/agentruns.agentrun.dev --timeout=60s
kubectl create serviceaccount agentrun-lap --dry-run=client -o yaml | kubectl apply -f -
kubectl create secret generic agentrun-s3 --dry-run=client -o yaml \
  --from-literal=AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" \
  --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" | kubectl apply -f -

say "example tool server on 127.0.0.1:8765"
nohup python3 examples/tool_server.py --port 8765 --record "$DEV_DIR/tool-calls.jsonl" \
  > "$DEV_DIR/tool-server.log" 2>&1 & echo $! > "$DEV_DIR/tool-server.pid"

# The operator reads the checkpoints itself: it keeps the S3 credentials of s3-up in its
# environment (the standard AWS chain); lap pods get them from the Secret (secretKeyRef).
say "operator (log: $DEV_DIR/operator.log, metrics: http://127.0.0.1:9090/metrics)"
AGENTRUN_CHECKPOINT_URI="s3://$AGENTRUN_S3_BUCKET/dev" \
AGENTRUN_S3_ENDPOINT="$AWS_ENDPOINT_URL" \
AGENTRUN_S3_REGION="$AWS_DEFAULT_REGION" \
AGENTRUN_S3_PATH_STYLE=true \
AGENTRUN_S3_CREDENTIALS_SECRET=agentrun-s3 \
AGENTRUN_LOG_FORMAT=text \
  nohup agentrun operator > "$DEV_DIR/operator.log" 2>&1 & echo $! > "$DEV_DIR/operator.pid"

say "kubectl apply -f examples/approval-run.yaml"
kubectl delete agentrun "$RUN" --ignore-not-found --wait=true
kubectl apply -f examples/approval-run.yaml
kubectl wait --for=jsonpath='{.status.phase}'=AwaitingApproval "agentrun/$RUN" --timeout=300s
kubectl get agentruns

if [ "${DEV_APPROVE:-auto}" = manual ]; then
  say "waiting for you:  source $DEV_DIR/dev.env; kubectl annotate agentrun $RUN approved=true"
  exit 0
fi
say "kubectl annotate agentrun $RUN approved=true"
kubectl annotate agentrun "$RUN" approved=true agentrun.dev/reason="make dev demo"
kubectl wait --for=jsonpath='{.status.phase}'=Succeeded "agentrun/$RUN" --timeout=300s
kubectl get agentruns
say "per-lap trace from the checkpoint store"
uid=$(kubectl get agentrun "$RUN" -o jsonpath='{.metadata.uid}')
agentrun trace --uri "s3://$AGENTRUN_S3_BUCKET/dev" --endpoint "$AWS_ENDPOINT_URL" --path-style \
  --namespace default --name "$RUN" --uid "$uid" || true
say "done. Use the cluster:  source $DEV_DIR/dev.env     Stop everything:  make dev-down"
