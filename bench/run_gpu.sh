#!/usr/bin/env bash
# The whole GPU set: fill, apply, e2e and latency with --device cuda; then, on a model
# that make-model writes (about Qwen3-0.6B's shape, random weights), e2e --model and
# throughput against transformers.
# Writes JSON + PNG under bench/results/<date>-gpu-<device>/ (printed at the end).
# Takes about 8-10 minutes on one H200; without CUDA every bench says so and skips.
set -euo pipefail
cd "$(dirname "$0")/.."
name=$(python -c 'import torch; print(torch.cuda.get_device_name().split()[-1].lower() if torch.cuda.is_available() else "none")')
out=${1:-bench/results/$(date -u +%Y-%m-%d)-gpu-${name}}
mkdir -p "$out"
for b in fill apply e2e; do
    timeout 200 python -m thinkgate bench "$b" --device cuda --json "$out/$b.json" --plot "$out/$b.png" \
        2>&1 | tee "$out/$b.txt"
done
timeout 100 python -m thinkgate bench latency --device cuda --requests 300 --seconds 5 \
    --json "$out/latency.json" --plot "$out/latency.png" 2>&1 | tee "$out/latency.txt"
if python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    # the model lives outside the results (2.4 GB of float32 weights); MODEL=DIR reuses one
    model=${MODEL:-$(mktemp -d)/model}
    [ -f "$model/config.json" ] || python -m thinkgate make-model "$model" --arch qwen3 \
        --layers 28 --hidden 1024 --heads 16 --kv-heads 8 --intermediate 3072
    timeout 600 python -m thinkgate bench e2e --device cuda --model "$model" \
        --json "$out/e2e-model.json" --plot "$out/e2e-model.png" 2>&1 | tee "$out/e2e-model.txt"
    timeout 600 python -m thinkgate bench throughput --device cuda --model "$model" \
        --requests 512 --batch-size 256 --new-tokens 128 \
        --json "$out/throughput.json" --plot "$out/throughput.png" 2>&1 | tee "$out/throughput.txt"
else
    echo "CUDA is not available: e2e --model and throughput skipped" | tee "$out/model.txt"
fi
echo "results in $out"
