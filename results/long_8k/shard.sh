#!/bin/bash
# Written by kvbench sweep --slurm (again at every submission): shard $SLURM_ARRAY_TASK_ID
# of the sweep into its own db, which a rerun resumes.
i="$SLURM_ARRAY_TASK_ID"
db='/work/main/results/long_8k'"/shard-$i.db"
rm -f '/work/main/results/long_8k'"/status/shard-$i.exit"
echo "kvbench: shard $i/10, task ${SLURM_ARRAY_JOB_ID}_$i on $(hostname) at $(date -u +%FT%TZ)"
rc=0
'/tmp/l8k/build/kvbench' '--threads' '1' '--device' 'cpu' '--dtype' 'fp32' '--decode-activations' 'fp32' '--prefill-activations' 'fp32' '--model' '/tmp/l8k/models/Qwen2.5-Coder-0.5B-Instruct.Q4_K_M.gguf' 'sweep' '/tmp/l8k/configs/long_8k.json' '--db' "$db" '--shard' "$i/10" || rc=$?
echo "$rc" > '/work/main/results/long_8k'"/status/shard-$i.exit"
exit "$rc"
