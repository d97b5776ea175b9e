#!/usr/bin/env bash
# The whole GPU set: fill, apply, e2e and latency with --device cuda.
# Writes JSON + PNG under bench/results/<date>-gpu-<device>/ (printed at the end).
# Takes about 2-3 minutes on one H200; without CUDA each bench says so and skips.
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
echo "results in $out"
