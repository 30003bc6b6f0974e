#!/usr/bin/env bash
# The main job on a recipe (default: the shipped demo pair), end to end on this machine:
#   check -> build (checkpoints, verification, engine plan) -> deploy (torch runtime) -> serve -> one request -> stop.
# `trtspec build` exits 3 outside the NGC image: checkpoints and the engine plan are done, and the engines are
# finished there with engines/<name>/finish_in_ngc.sh. The torch runtime serves the HF checkpoints meanwhile.
# Usage: tools/demo.sh [RECIPE] [PROMPT]     (run by `make demo` with the virtualenv first on PATH)
set -euo pipefail

recipe=${1:-demo}
prompt=${2:-"def fibonacci(n):"}
http_port=${TRTSPEC_DEMO_HTTP_PORT:-8000}
grpc_port=${TRTSPEC_DEMO_GRPC_PORT:-8001}
metrics_port=${TRTSPEC_DEMO_METRICS_PORT:-8002}

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

# check first: a recipe it cannot read is one line from it, not a traceback from reading the name below
step "trtspec check $recipe"
trtspec check "$recipe"
name=$(python -c 'import sys; from trtspec.recipe import load_recipe; print(load_recipe(sys.argv[1]).name)' "$recipe")
repo="triton_repo/$name"

step "trtspec build $recipe"
status=0
trtspec build "$recipe" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 3 ]; then
    exit "$status"
fi

step "trtspec deploy $recipe --runtime torch --out $repo"
trtspec deploy "$recipe" --runtime torch --out "$repo"

step "trtspec serve $repo (background)"
log=$(mktemp -t trtspec-serve.XXXXXX.log)
# setsid: the server gets its own process group, so SIGINT below reaches it and nothing else.
setsid trtspec serve "$repo" --http-port "$http_port" --grpc-port "$grpc_port" --metrics-port "$metrics_port" \
    >"$log" 2>&1 &
server=$!
stop_server() {
    kill -INT "$server" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$server" 2>/dev/null || return 0; sleep 0.2; done
    kill -KILL "$server" 2>/dev/null || true
}
trap stop_server EXIT

ready=0
for _ in $(seq 1 300); do
    if python - "$http_port" <<'EOF' 2>/dev/null; then ready=1; break; fi
import sys, urllib.request
urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/v2/health/ready", timeout=1)
EOF
    kill -0 "$server" 2>/dev/null || { cat "$log"; echo "trtspec serve exited before it was ready" >&2; exit 1; }
    sleep 0.5
done
if [ "$ready" -ne 1 ]; then
    tail -n 40 "$log" >&2
    echo "trtspec serve was not ready after 300 tries (at least 150 s); its log: $log" >&2
    exit 1
fi
cat "$log"

step "one streaming request over gRPC (tools/client.py)"
python "$(dirname "$0")/client.py" --url "127.0.0.1:$grpc_port" --protocol grpc --stream --max-tokens 64 \
    --num-draft-tokens 4 "$prompt"

step "stop the server"
stop_server
trap - EXIT
echo "done: repository $repo; serve it again with: trtspec serve $repo"
