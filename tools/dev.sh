#!/usr/bin/env bash
# `make dev`: the whole product on this machine, then the example invoice run up to its approval.
#
#   tools/dev.sh [up]   a local control plane (etcd, kube-apiserver, kube-controller-manager, a
#                       process kubelet), an S3 server, the CRD, the operator, the recording tool
#                       server, the MCP ledger server (examples/mcp_tool_server.py), and
#                       examples/invoice-run.yaml and examples/mcp-agent.yaml (an Agent whose tools
#                       come from that MCP server, and a run of it) applied; waits until the invoice
#                       run asks for approval and the MCP agent's run Succeeded, and prints what to
#                       type next.
#   tools/dev.sh down   stops all of it (`make dev-down`): no process, no pid file left.
#
# A second `up` reuses the control plane, S3 and the tool and MCP servers when they are alive (a dead or
# half-started one is cleaned up and started again), restarts the operator (so it runs the current
# code) and re-applies the examples (unchanged if they exist).
#
# Environment:
#   LOCALKUBE_DIR     state directory (default .localkube): kubeconfig, logs, pids, dev.env
#   DEV_APPROVE       manual (default): stop at AwaitingApproval and leave the decision to you;
#                     auto: approve it, wait for Succeeded and print the trace (tests, CI)
#   DEV_TOOL_PORT     port of the tool server (default 8765; a busy port falls back to a free one)
#   DEV_MCP_PORT      port of the MCP ledger server (default 8766; same fallback)
#   DEV_METRICS_PORT  port of the operator's /metrics (default 9090; same fallback)
#   DEV_INBOX_PORT    port of the approval inbox (default 8088; same fallback)
#   AGENTRUN_NODE     runc: lap pods run `agentrun lap` in the agentrun image under runc, with their
#                     securityContext enforced (e2e/runc_node.py); the image is built first
#                     (`make image`, cached). Default: host processes from this checkout's venv.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEV_DIR=${LOCALKUBE_DIR:-.localkube}
mkdir -p "$DEV_DIR"
DEV_DIR=$(cd "$DEV_DIR" && pwd)
RUN=invoices-2024-06
EXAMPLE=examples/invoice-run.yaml
MCP_RUN=ledger-inv-2001  # the run of the Agent in MCP_EXAMPLE
MCP_EXAMPLE=examples/mcp-agent.yaml
PY=${PYTHON:-python3}
# how to refer to the state dir in the printed commands: relative when it is inside the repo
SHOW_DIR=${DEV_DIR#"$ROOT"/}

START=$(date +%s)
say() { printf '\n\033[1m== [%ss] %s\033[0m\n' "$(( $(date +%s) - START ))" "$*"; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
port_free() { "$PY" -c 'import socket,sys; s=socket.socket(); s.bind(("127.0.0.1", int(sys.argv[1])))' "$1" 2>/dev/null; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pick_port() {  # $1 wanted port (0: any); prints a free port, the wanted one when it is free
  if [ "$1" != 0 ] && port_free "$1"; then echo "$1"; else free_port; fi
}
stop_pid() {  # $1 name, $2 pid file: SIGTERM, SIGKILL after 10 s, wait until gone, remove the file
  local f=$2 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill "$pid" 2>/dev/null; then
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "$1 (pid $pid) ignored SIGTERM: SIGKILL"; kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$f"
}

down() {
  stop_pid operator "$DEV_DIR/operator.pid"
  stop_pid inbox "$DEV_DIR/inbox.pid"
  rm -f "$DEV_DIR/inbox.port"
  stop_pid "tool server" "$DEV_DIR/tool-server.pid"
  rm -f "$DEV_DIR/tool-server.port" "$DEV_DIR/metrics.port"
  stop_pid "MCP server" "$DEV_DIR/mcp-server.pid"
  rm -f "$DEV_DIR/mcp-server.port"
  "$PY" e2e/cluster.py s3-down --dir "$DEV_DIR/s3" || true
  "$PY" e2e/cluster.py down --dir "$DEV_DIR"
  rm -rf "$DEV_DIR/pods"  # the process kubelet's pod dirs (lap.pid, pod logs) of the stopped cluster
  echo "stopped everything started from $DEV_DIR (logs kept in $SHOW_DIR/logs and $SHOW_DIR/*.log)"
}

if [ "${1:-up}" = down ]; then down; exit 0; fi
[ "${1:-up}" = up ] || { echo "usage: tools/dev.sh [up|down]" >&2; exit 2; }
MODE=${DEV_APPROVE:-manual}
case "$MODE" in manual|auto) ;; *) echo "DEV_APPROVE must be manual or auto, not '$MODE'" >&2; exit 2 ;; esac
command -v agentrun >/dev/null || { echo "agentrun is not on PATH: run 'make install' (pip install -e '.[test]')" >&2; exit 1; }
AGENTRUN_BIN=$(command -v agentrun)

NODE=${AGENTRUN_NODE:-}
case "$NODE" in ""|runc) ;; *) echo "AGENTRUN_NODE must be runc or empty, not '$NODE'" >&2; exit 2 ;; esac
LAP_COMMAND="[\"$AGENTRUN_BIN\", \"lap\"]"
LAP_IMAGE=""
if [ "$NODE" = runc ]; then
  say "AGENTRUN_NODE=runc: the agentrun image (make image; cached)"
  bash tools/image/build.sh build
  LAP_IMAGE=$(tar -xOf "$(bash tools/image/build.sh path)" index.json \
    | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])')
  LAP_COMMAND='["agentrun", "lap"]'  # the image's entry point
  export AGENTRUN_LAP_IMAGE=$LAP_IMAGE  # the operator's lap pods use it
fi
export AGENTRUN_NODE=$NODE

# ---------------------------------------------------------------- control plane
cluster_env() {  # prints KUBECONFIG/PATH exports of the cluster in DEV_DIR, from its cluster.json
  "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1])); print("export KUBECONFIG=" + c["kubeconfig"]); print("export PATH=" + c["bin_dir"] + ":$PATH")' "$DEV_DIR/cluster.json"
}
if alive "$DEV_DIR/localkube.pid" && alive "$DEV_DIR/kubelet.pid" && [ -f "$DEV_DIR/cluster.json" ] \
   && [ "$(cat "$DEV_DIR/node" 2>/dev/null)" = "$NODE" ] \
   && eval "$(cluster_env)" && kubectl get --raw /readyz >/dev/null 2>&1; then
  say "control plane: already running in $SHOW_DIR (reused)"
else
  say "control plane (etcd, kube-apiserver, kube-controller-manager, process kubelet) in $SHOW_DIR"
  if [ -f "$DEV_DIR/localkube.pid" ] || [ -f "$DEV_DIR/kubelet.pid" ]; then  # what a crashed run left, or another AGENTRUN_NODE
    "$PY" e2e/cluster.py down --dir "$DEV_DIR" >/dev/null 2>&1 || true
  fi
  eval "$("$PY" e2e/cluster.py up --dir "$DEV_DIR")"
fi

# ---------------------------------------------------------------- S3
s3_env() {
  "$PY" -c 'import json,sys; s=json.load(open(sys.argv[1]))
for k, v in {"AWS_ENDPOINT_URL": s["endpoint_url"], "AWS_ACCESS_KEY_ID": s["access_key"], "AWS_SECRET_ACCESS_KEY": s["secret_key"],
             "AWS_DEFAULT_REGION": s["region"], "AGENTRUN_S3_BUCKET": s["bucket"]}.items(): print(f"export {k}={v}")' "$DEV_DIR/s3/s3.json"
}
if alive "$DEV_DIR/s3/s3.pid" && [ -f "$DEV_DIR/s3/s3.json" ] && eval "$(s3_env)" \
   && curl -sf -o /dev/null "$AWS_ENDPOINT_URL/$AGENTRUN_S3_BUCKET?list-type=2"; then
  say "S3 server: already running at $AWS_ENDPOINT_URL (reused)"
else
  say "S3 server"
  "$PY" e2e/cluster.py s3-down --dir "$DEV_DIR/s3" >/dev/null 2>&1 || true
  eval "$("$PY" e2e/cluster.py s3-up --dir "$DEV_DIR/s3")"
fi
CHECKPOINT_URI="s3://$AGENTRUN_S3_BUCKET/dev"

# ---------------------------------------------------------------- CRD, ServiceAccount, Secret
say "CRDs, approval and tenancy admission policies (docs/security.md), lap ServiceAccount, S3 credentials Secret (kubectl apply: unchanged when present)"
kubectl apply -f crds/
kubectl wait --for=condition=Established crd/agentruns.agentrun.dev crd/agentrunpolicies.agentrun.dev --timeout=60s
# Tenancy guardrails (docs/security.md): the agentrun-tenancy policy and binding came with crds/; its
# parameters here are the local control plane's AgentRunPolicy "default" (generated by `make crds`):
# loopback is intended (the tool server and S3 listen on 127.0.0.1); link-local, cloud metadata and
# the API server stay refused. Wait until a valid run passes it (paramKind and param picked up).
kubectl apply -f e2e/tenancy-local-policy.yaml
# The admission policies are loaded, and learn the new CRDs' schemas, some seconds after Established;
# until then runs are refused (docs/operations.md). Wait until a valid run passes them all.
"$PY" e2e/cluster.py wait-admitted --dir "$DEV_DIR"
kubectl create serviceaccount agentrun-lap --dry-run=client -o yaml | kubectl apply -f -
kubectl create secret generic agentrun-s3 --dry-run=client -o yaml \
  --from-literal=AWS_ACCESS_KEY_ID="$AWS_ACCESS_KEY_ID" \
  --from-literal=AWS_SECRET_ACCESS_KEY="$AWS_SECRET_ACCESS_KEY" | kubectl apply -f -

# ---------------------------------------------------------------- tool servers
# serve LABEL BASE WANT_PORT PORT_VAR HEALTH_PATH NOTE COMMAND...: a server of the examples on
# 127.0.0.1, reused when its pid is alive and HEALTH_PATH answers, else started with nohup (the word
# @PORT@ in COMMAND is its port; its pid, port and log are DEV_DIR/BASE.{pid,port,log}). Sets SERVED_PORT.
serve() {
  local label=$1 base=$2 want=$3 var=$4 health=$5 note=$6 port args=() a; shift 6
  up() { curl -sf -o /dev/null "http://127.0.0.1:$1$health"; }
  if alive "$DEV_DIR/$base.pid" && [ -s "$DEV_DIR/$base.port" ] && up "$(cat "$DEV_DIR/$base.port")"; then
    port=$(cat "$DEV_DIR/$base.port")
    say "$label: already running on 127.0.0.1:$port (reused)"
  else
    stop_pid "$label" "$DEV_DIR/$base.pid"
    port=$(pick_port "$want")
    [ "$port" = "$want" ] || [ "$want" = 0 ] || echo "port $want is busy: the $label uses $port (set $var to choose)"
    say "$label on 127.0.0.1:$port ($note)"
    rm -f "$DEV_DIR/$base.port"
    for a in "$@"; do args+=("${a//@PORT@/$port}"); done
    nohup "${args[@]}" > "$DEV_DIR/$base.log" 2>&1 &
    echo $! > "$DEV_DIR/$base.pid"
    for _ in $(seq 600); do up "$port" && break; alive "$DEV_DIR/$base.pid" || break; sleep 0.1; done
    up "$port" || { tail -20 "$DEV_DIR/$base.log"; echo "the $label did not start" >&2; exit 1; }
    echo "$port" > "$DEV_DIR/$base.port"
  fi
  SERVED_PORT=$port
}
serve "tool server" tool-server "${DEV_TOOL_PORT:-8765}" DEV_TOOL_PORT /calls "record: $SHOW_DIR/tool-calls.jsonl" \
  "$PY" examples/tool_server.py --port @PORT@ --record "$DEV_DIR/tool-calls.jsonl"
TOOL_PORT=$SERVED_PORT
TOOL_URL="http://127.0.0.1:$TOOL_PORT"
# examples/mcp_tool_server.py: an MCP server written with agentrun.toolkit; its ledger and the
# toolkit's idempotency keys live in one SQLite file of the state dir (kept across restarts).
serve "MCP ledger server" mcp-server "${DEV_MCP_PORT:-8766}" DEV_MCP_PORT /_record \
  "examples/mcp_tool_server.py; ledger: $SHOW_DIR/ledger.sqlite3" \
  "$PY" examples/mcp_tool_server.py --port @PORT@ --db "$DEV_DIR/ledger.sqlite3"
MCP_PORT=$SERVED_PORT
MCP_URL="http://127.0.0.1:$MCP_PORT"

# ---------------------------------------------------------------- operator (always restarted)
# It reads the checkpoints itself with the S3 credentials of its environment (the standard AWS
# chain); lap pods get them from the Secret (secretKeyRef).
stop_pid operator "$DEV_DIR/operator.pid"
want=${DEV_METRICS_PORT:-9090}
METRICS_PORT=$(pick_port "$want")
[ "$METRICS_PORT" = "$want" ] || [ "$want" = 0 ] || echo "port $want is busy: the operator's metrics use $METRICS_PORT (set DEV_METRICS_PORT to choose)"
echo "$METRICS_PORT" > "$DEV_DIR/metrics.port"
say "operator (log: $SHOW_DIR/operator.log, metrics: http://127.0.0.1:$METRICS_PORT/metrics)"
AGENTRUN_CHECKPOINT_URI="$CHECKPOINT_URI" \
AGENTRUN_S3_ENDPOINT="$AWS_ENDPOINT_URL" \
AGENTRUN_S3_REGION="$AWS_DEFAULT_REGION" \
AGENTRUN_S3_PATH_STYLE=true \
AGENTRUN_S3_CREDENTIALS_SECRET=agentrun-s3 \
AGENTRUN_LAP_COMMAND="$LAP_COMMAND" \
AGENTRUN_LEASE_DURATION=5 \
AGENTRUN_LOG_FORMAT=text \
  nohup "$AGENTRUN_BIN" operator --metrics-port "$METRICS_PORT" >> "$DEV_DIR/operator.log" 2>&1 &
echo $! > "$DEV_DIR/operator.pid"

# ---------------------------------------------------------------- approval inbox (always restarted)
# docs/inbox.md. A dev approver (ServiceAccount dev-approver bound to an agentrun-approver
# ClusterRole, the chart's rules) signs in with a token; the inbox itself uses the admin kubeconfig
# here and impersonates the person (in the chart its ServiceAccount may only impersonate).
kubectl apply -f - <<'YAML'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: agentrun-approver}
rules:
- {apiGroups: [agentrun.dev], resources: [agentruns], verbs: [get, list, watch, patch, approve]}
- {apiGroups: [agentrun.dev], resources: [agentruns/status], verbs: [get, patch]}
YAML
kubectl create serviceaccount dev-approver --dry-run=client -o yaml | kubectl apply -f -
kubectl create clusterrolebinding dev-approver --clusterrole=agentrun-approver --serviceaccount=default:dev-approver \
  --dry-run=client -o yaml | kubectl apply -f -
stop_pid inbox "$DEV_DIR/inbox.pid"
want=${DEV_INBOX_PORT:-8088}
INBOX_PORT=$(pick_port "$want")
[ "$INBOX_PORT" = "$want" ] || [ "$want" = 0 ] || echo "port $want is busy: the inbox uses $INBOX_PORT (set DEV_INBOX_PORT to choose)"
say "approval inbox on http://127.0.0.1:$INBOX_PORT (log: $SHOW_DIR/inbox.log)"
rm -f "$DEV_DIR/inbox.port"
AGENTRUN_S3_ENDPOINT="$AWS_ENDPOINT_URL" AGENTRUN_S3_PATH_STYLE=true \
  nohup "$AGENTRUN_BIN" inbox --listen 127.0.0.1 --port "$INBOX_PORT" --port-file "$DEV_DIR/inbox.port" \
  >> "$DEV_DIR/inbox.log" 2>&1 &
echo $! > "$DEV_DIR/inbox.pid"
for _ in $(seq 300); do [ -s "$DEV_DIR/inbox.port" ] && break; sleep 0.1; done
[ -s "$DEV_DIR/inbox.port" ] || { tail -20 "$DEV_DIR/inbox.log"; echo "the inbox did not start" >&2; exit 1; }
INBOX_URL="http://127.0.0.1:$INBOX_PORT"

# ---------------------------------------------------------------- dev.env
cat > "$DEV_DIR/dev.env" <<EOF
# source this file: kubectl and agentrun then talk to the local cluster and its checkpoint store
export KUBECONFIG=$KUBECONFIG
export PATH=$(dirname "$(command -v kubectl)"):$(dirname "$AGENTRUN_BIN"):\$PATH
export AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL
export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID
export AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
export AWS_DEFAULT_REGION=$AWS_DEFAULT_REGION
export AGENTRUN_S3_BUCKET=$AGENTRUN_S3_BUCKET
export AGENTRUN_CHECKPOINT_URI=$CHECKPOINT_URI
export AGENTRUN_S3_ENDPOINT=$AWS_ENDPOINT_URL
export AGENTRUN_S3_PATH_STYLE=true
export AGENTRUN_TOOL_SERVER=$TOOL_URL
export AGENTRUN_MCP_SERVER=$MCP_URL
export AGENTRUN_METRICS_URL=http://127.0.0.1:$METRICS_PORT/metrics
EOF

# ---------------------------------------------------------------- the example run
say "kubectl apply -f $EXAMPLE   (tool URLs pointed at $TOOL_URL)"
sed "s#http://127.0.0.1:8765/#$TOOL_URL/#g" "$EXAMPLE" > "$DEV_DIR/invoice-run.yaml"
kubectl apply -f "$DEV_DIR/invoice-run.yaml"
say "kubectl apply -f $MCP_EXAMPLE   (an Agent whose tools come from the MCP server at $MCP_URL/mcp, and a run of it)"
sed "s#http://127.0.0.1:8766/#$MCP_URL/#g" "$MCP_EXAMPLE" > "$DEV_DIR/mcp-agent.yaml"
kubectl apply -f "$DEV_DIR/mcp-agent.yaml"

phase() { kubectl get agentrun "${1:-$RUN}" -o jsonpath='{.status.phase}' 2>/dev/null || true; }
lap() { kubectl get agentrun "${1:-$RUN}" -o jsonpath='{.status.lap}' 2>/dev/null || true; }
wait_run() {  # $1 run, $2 timeout seconds, then the phases to wait for; prints each new lap
  local run=$1 timeout=$2 end last="" p l; shift 2
  end=$(( $(date +%s) + timeout ))
  while :; do
    p=$(phase "$run"); l=$(lap "$run")
    [ "$p $l" = "$last" ] || { echo "  $run: ${p:-Pending} lap ${l:-0}"; last="$p $l"; }
    for want in "$@"; do [ "$p" = "$want" ] && return 0; done
    case "$p" in Failed|BudgetExceeded)
      kubectl get agentrun "$run" -o wide; echo "the run ended $p; see $SHOW_DIR/operator.log" >&2; return 1 ;;
    esac
    [ "$(date +%s)" -lt "$end" ] || { echo "timed out waiting for $run to reach $*" >&2; kubectl get agentrun "$run" -o wide; return 1; }
    alive "$DEV_DIR/operator.pid" || { tail -20 "$DEV_DIR/operator.log"; echo "the operator died" >&2; return 1; }
    sleep 0.5
  done
}
wait_phase() { wait_run "$RUN" "$@"; }  # the invoice run
say "waiting for the run to ask for approval (8 laps: fetch the batch, book 6 invoices, ask to pay)"
wait_phase 300 AwaitingApproval Succeeded
say "waiting for $MCP_RUN, the MCP agent's run (3 laps: ledger__book_invoice, ledger__lookup_invoice, done)"
wait_run "$MCP_RUN" 300 Succeeded
kubectl get agentruns

trace_cmd="agentrun trace $RUN"
if [ "$MODE" = auto ]; then
  if [ "$(phase)" = AwaitingApproval ]; then
    say "DEV_APPROVE=auto: kubectl annotate agentrun $RUN approved=true"
    kubectl annotate agentrun "$RUN" approved=true agentrun.dev/reason="make dev (DEV_APPROVE=auto)"
  fi
  wait_phase 300 Succeeded
  kubectl get agentruns
  say "$trace_cmd"
  # shellcheck disable=SC1091
  (source "$DEV_DIR/dev.env" && agentrun trace "$RUN")
  say "the tool server's record: each side effect once"
  "$PY" examples/tool_server.py --show --url "$TOOL_URL"
  say "agentrun trace $MCP_RUN   (the MCP agent's run)"
  # shellcheck disable=SC1091
  (source "$DEV_DIR/dev.env" && agentrun trace "$MCP_RUN")
  say "the MCP ledger's record (GET $MCP_URL/_record): each booking once"
  curl -sf "$MCP_URL/_record" | "$PY" -c 'import json,sys; r=json.load(sys.stdin); print(json.dumps(r, sort_keys=True))
twice = sum(1 for n in r["executions"].values() if n > 1)
print("%d booking(s), %d key(s), %d key(s) executed twice, %d without a key"
    % (r["bookings"], len(r["executions"]), twice, r["withoutKey"]))'
fi

step() { printf '  %-64s # %s\n' "$1" "$2"; }
printf '\n\033[1m== [%ss] Next: type these in your shell\033[0m\n' "$(( $(date +%s) - START ))"
step "source $SHOW_DIR/dev.env" "kubectl and agentrun: the local cluster and store"
step "kubectl get agentruns -w" "watch (Ctrl-C to stop)"
if [ "$(phase)" = AwaitingApproval ]; then
  step "agentrun approvals" "the approval queue"
  step "agentrun approve $RUN --reason \"matches the PO batch\"" "approve the payment"
  step "kubectl annotate agentrun $RUN approved=true" "... or the same, by hand"
else
  echo "  ($RUN is $(phase); to run it again: kubectl delete agentrun $RUN, then make dev)"
fi
step "$trace_cmd" "each lap, from the checkpoint store"
step "python3 examples/tool_server.py --show" "each side effect once, with its key"
step "agentrun describe $MCP_RUN" "the MCP agent's run: the Agent it runs (status.agent)"
step "agentrun trace $MCP_RUN" "its laps: the ledger__* tools over MCP"
step "curl -s \$AGENTRUN_MCP_SERVER/_record" "the MCP ledger: each booking once, by key"
step "$( [ "$SHOW_DIR" = .localkube ] || printf 'LOCALKUBE_DIR=%s ' "$SHOW_DIR")make dev-down" "stop everything"
# the token travels in the URL's fragment, which the browser never sends to a server
printf '\n\033[1m== Approval inbox (docs/inbox.md): open this to sign in as the dev approver\033[0m\n  %s/login#token=%s\n' \
  "$INBOX_URL" "$(kubectl create token dev-approver --duration=24h)"
echo "  (or sign in at $INBOX_URL/login with any token: kubectl create token NAME)"
echo "tool server: $TOOL_URL   MCP server: $MCP_URL/mcp   metrics: http://127.0.0.1:$METRICS_PORT/metrics   logs: $SHOW_DIR/*.log"
