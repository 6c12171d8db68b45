#!/bin/bash
# Written by kvbench sweep --slurm: the shards' dbs merged, the leaderboard written.
set -euo pipefail
rm -f '/work/main/results/long_8k/status/merge.exit' '/work/main/results/long_8k/merged.db' '/work/main/results/long_8k/merged.db-wal' '/work/main/results/long_8k/merged.db-shm'
'/tmp/l8k/build/kvbench' 'merge' '/work/main/results/long_8k/shard-0.db' '/work/main/results/long_8k/shard-1.db' '/work/main/results/long_8k/shard-2.db' '/work/main/results/long_8k/shard-3.db' '/work/main/results/long_8k/shard-4.db' '/work/main/results/long_8k/shard-5.db' '/work/main/results/long_8k/shard-6.db' '/work/main/results/long_8k/shard-7.db' '/work/main/results/long_8k/shard-8.db' '/work/main/results/long_8k/shard-9.db' '-o' '/work/main/results/long_8k/merged.db'
'/tmp/l8k/build/kvbench' 'report' '/work/main/results/long_8k/merged.db' '-o' '/work/main/results/long_8k/report'
echo 0 > '/work/main/results/long_8k/status/merge.exit'
