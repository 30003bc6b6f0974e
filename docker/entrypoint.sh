#!/usr/bin/env bash
# trtspec container entry point: check -> build (engines for tensorrtllm, ModelOpt HF exports of quantized models
# for trtllm-pytorch) -> deploy -> serve.
#
# Configuration (environment only; values are passed to trtspec as single arguments, never evaluated):
#   TRTSPEC_RECIPE        recipe file                         [/workspace/recipes/recipe.yaml]
#   TRTSPEC_ENGINES_DIR   where engines/<name>/ is built      [/workspace/engines]
#   TRTSPEC_REPO_DIR      the repository goes to DIR/<name>   [/workspace/triton_repo]
#   TRTSPEC_RUNTIME       tensorrtllm | trtllm-pytorch | torch [the recipe's triton.runtime]
#   TRTSPEC_HOST          address tritonserver binds          [0.0.0.0, see below]
#   TRTSPEC_HTTP_PORT / TRTSPEC_GRPC_PORT / TRTSPEC_METRICS_PORT   [8000 / 8001 / 8002]
# With arguments (`docker run IMAGE trtspec validate ...`) it runs those instead.
set -euo pipefail

readonly EXIT_USAGE=2
readonly EXIT_NEEDS_TENSORRT_LLM=3

log() { printf '[trtspec-entrypoint] %s\n' "$*" >&2; }

# Run one step (check, build, deploy) with `docker stop`'s signal passed on to it. The init process (tini) and
# `docker stop` signal this shell only: without this the step would run on (SIGINT) or be orphaned (SIGTERM), and a
# stopped build would go on to deploy. The step gets SIGTERM either way (a background job of a script starts with
# SIGINT ignored; trtspec stops on SIGTERM as on Ctrl-C, no half-written output). After a stop signal the entry
# point ends with the step.
stop_signal=""
child=""
step() {
    local status=0
    # the traps before the step starts: a signal between the two would end this shell and orphan the step
    trap 'stop_signal=INT; [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null || true' INT
    trap 'stop_signal=TERM; [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null || true' TERM
    "$@" &
    child=$!
    if [[ -n "$stop_signal" ]]; then  # it came before the step's pid was known
        kill -TERM "$child" 2>/dev/null || true
    fi
    # wait returns early (status > 128) when a trapped signal arrives: wait again for the step's own end
    while true; do
        status=0
        wait "$child" || status=$?
        kill -0 "$child" 2>/dev/null || break
    done
    if [[ -n "$stop_signal" ]]; then
        # still trapped, and no subshell: bash kills itself on a SIGINT it saw while a child ran once INT is
        # untrapped, which a command substitution here would set off
        log "stopped by SIG${stop_signal} during: $*"
        if [[ "$stop_signal" == INT ]]; then exit 130; fi
        exit 143
    fi
    trap - INT TERM
    child=""
    return "$status"
}

# "<name> <runtime>" of a recipe. The name is validated by the recipe schema ([A-Za-z0-9._-], no ".."), so it
# is safe as a folder name; the recipe path reaches Python as an argument, not as code.
recipe_facts() {
    python3 - "$1" <<'PY'
import sys

from trtspec.core.errors import TrtspecError
from trtspec.recipe import load_recipe

try:
    recipe = load_recipe(sys.argv[1])
except TrtspecError as err:
    print(f"Error: {err.message}", file=sys.stderr)
    sys.exit(err.exit_code)
print(recipe.name, recipe.triton.runtime)
PY
}

# What the runtime serves: engines (tensorrtllm) or quantized models' ModelOpt HF exports (trtllm-pytorch).
# `trtspec build` skips every stage whose inputs and outputs are unchanged, so calling it on each start costs a
# few hashes when the outputs are current and rebuilds exactly the stale stages when the recipe or models changed.
build_outputs() {
    local recipe="$1" runtime="$2" engines_dir="$3" status=0
    step trtspec build "$recipe" --runtime "$runtime" --engines-dir "$engines_dir" || status=$?
    if [[ $status -eq $EXIT_NEEDS_TENSORRT_LLM ]]; then
        # Outside the NGC image exit 3 means "finish there"; in a container meant to serve it is a real error.
        log "tensorrt_llm is not importable in this image, or not the pinned release (build's line above says"
        log "which): the tensorrtllm runtime needs the NGC image (docker/Dockerfile); use TRTSPEC_RUNTIME=torch for"
        log "the CPU image"
    fi
    return "$status"
}

# Only the runtimes `trtspec deploy` writes; checked before any work so a typo fails in a second.
require_runtime() {
    case "$1" in
        tensorrtllm | trtllm-pytorch | torch) ;;
        *)
            log "TRTSPEC_RUNTIME='$1' is not a runtime; use tensorrtllm, trtllm-pytorch or torch"
            exit "$EXIT_USAGE"
            ;;
    esac
}

main() {
    if [[ $# -gt 0 ]]; then
        exec "$@"
    fi
    local recipe="${TRTSPEC_RECIPE:-/workspace/recipes/recipe.yaml}"
    local engines_dir="${TRTSPEC_ENGINES_DIR:-/workspace/engines}"
    local repo_dir="${TRTSPEC_REPO_DIR:-/workspace/triton_repo}"
    # 0.0.0.0 because inside a container the server must listen on the container's own interface for a
    # published port to reach it; what the host exposes is decided by publishing (compose.yaml binds
    # 127.0.0.1). Outside a container set TRTSPEC_HOST=127.0.0.1.
    local host="${TRTSPEC_HOST:-0.0.0.0}"
    local http_port="${TRTSPEC_HTTP_PORT:-8000}"
    local grpc_port="${TRTSPEC_GRPC_PORT:-8001}"
    local metrics_port="${TRTSPEC_METRICS_PORT:-8002}"

    if [[ -n "${TRTSPEC_RUNTIME:-}" ]]; then
        require_runtime "$TRTSPEC_RUNTIME"
    fi

    local facts name runtime
    facts="$(recipe_facts "$recipe")"
    read -r name runtime <<<"$facts"
    # One effective runtime for check, build and deploy (TRTSPEC_RUNTIME overrides the recipe's).
    runtime="${TRTSPEC_RUNTIME:-$runtime}"
    require_runtime "$runtime"

    log "1/4 check ${recipe} (${runtime} runtime)"
    step trtspec check "$recipe" --runtime "$runtime"
    case "$runtime" in
        tensorrtllm)
            log "2/4 build engines into ${engines_dir}/${name} (up-to-date stages are skipped)"
            build_outputs "$recipe" "$runtime" "$engines_dir"
            ;;
        trtllm-pytorch)
            log "2/4 build: ModelOpt HF checkpoints of quantized models into ${engines_dir}/${name} (no engines)"
            build_outputs "$recipe" "$runtime" "$engines_dir"
            ;;
        *) log "2/4 no build: the torch runtime serves the Hugging Face checkpoints" ;;
    esac

    local repo="${repo_dir}/${name}"
    log "3/4 deploy the ${runtime} repository to ${repo}"
    step trtspec deploy "$recipe" --runtime "$runtime" --out "$repo" --engines-dir "$engines_dir"

    log "4/4 serve on ${host} (http ${http_port}, grpc ${grpc_port}, metrics ${metrics_port})"
    # exec: the server process replaces this shell, so `docker stop` (STOPSIGNAL SIGINT) reaches it directly.
    exec trtspec serve "$repo" --host "$host" \
        --http-port "$http_port" --grpc-port "$grpc_port" --metrics-port "$metrics_port"
}

main "$@"
