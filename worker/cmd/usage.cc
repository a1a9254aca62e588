// The text `railyard-worker --help` prints: every flag of `train` (docs/worker.md has the same table with more words).
#include "worker/cmd/flags.h"

namespace railyard::worker {

const char* const kUsage = R"(usage: railyard-worker train [flags]
  --device D           auto (default: CUDA when this binary has CUDA and a GPU is visible, else the CPU), cpu or
                       cuda (an error without a GPU); the config file's "device" / spec.device
  --model SPEC         preset (tiny, gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1.5b) or l=L,c=C,nh=NH,t=maxT,v=V
                       (default tiny; with --init-from, the file's shape unless given)
  --data PATH          training shards, from `railyard data prepare`: a directory DIR (its train_*.bin) or a glob
                       (e.g. /data/train_*.bin; the matching files, sorted); the config's data.train / spec.data.train
  --val-data PATH      validation shards: a glob, or a directory (its val_*.bin); default val_*.bin beside --data's
                       shards (DIR/val_*.bin); the config's data.val / spec.data.val
  --steps N            optimizer steps (default 10)
  --batch B            sequences per micro-batch (default 4)
  --seq T              tokens per sequence (default 64, <= maxT)
  --global-batch TOK   tokens per optimizer step, a multiple of B*T (default B*T; more = gradient accumulation)
  --lr X               peak learning rate (default 6e-4)
  --warmup N           linear warmup steps (default 0)
  --min-lr-frac F      cosine decays to lr*F at the last step (default 0.1)
  --weight-decay X     AdamW decay on 2-D weights (default 0.1)
  --grad-clip X        global-norm clip, 0 = off (default 1.0)
  --seed N             weight init and data order (default 1337)
  --val-every N        validate every N steps, 0 = never (default 0)
  --val-steps N        batches per validation (default 10)
  --sample-every N     log a text sample drawn from the model every N steps and after the last (default 0 = never;
                       rank 0, whole models only; "worker: sample" and the JSON log's "sample" event; the config's
                       training.sampleEvery / spec.training.sampleEvery)
  --sample-tokens N    tokens per sample (default 64, below the model's maxT; spec.training.sampleTokens)
  --threads N          compute threads (default RAILYARD_NUM_THREADS, else the CPUs this process may use)
  --init-from FILE     start from an llm.c GPT-2 model file (the config's model.initFrom / spec.model.initFrom); a
                       restored checkpoint wins over it
  --export FILE        write the final weights as an llm.c GPT-2 model file (fp32, version 3)
  --log-json FILE      append one JSON object per step/validation
  --peak-flops X       FLOP/s that MFU is relative to (default: the measured GEMM rate of this step's shapes)
  --max-bad-steps K    exit 3 after K consecutive steps with non-finite loss/gradients (default 3)
  --metrics-port P     serve Prometheus /metrics on P (0 = any free port; default RAILYARD_METRICS_PORT + LOCAL_RANK
                       when that is set, else off); labels from the agent's env (docs/worker.md)
  --metrics-host H     address to listen on (default RAILYARD_POD_IP, else 127.0.0.1)
  --config FILE        the worker configuration (the agent's RAILYARD_CONFIG: model, training, layout, data,
                       checkpoint, parallelism, memory; docs/rendezvous.md); flags given on the command line win
  --ckpt-dir DIR       checkpoint root (spec.checkpoint.path); saves params, AdamW m/v, counters, loader and LR position
  --ckpt-every N       save every N steps (default spec.checkpoint.intervalSteps, else 0: only at the end / SIGTERM)
  --ckpt-keep K        complete checkpoints kept (default 3)
  --ckpt-async on|off  copy the snapshot during the next step's forward/backward (default on)
  --ckpt-shm-every N   also keep the newest snapshot in shared memory every N steps, taken before the step is
                       reported (default spec.checkpoint.memoryIntervalSteps, else 0: off); restores prefer it when
                       every rank holds it and it is at least as new as the disk
  --ckpt-term-budget S on SIGTERM: finish the step, save within S seconds of the signal, exit 143 (default 8)
  --data-root DIR      refuse a --data/--val-data (or the config's data.train/val), or a shard they match, that
                       resolves outside DIR, symlinks included
                       (default RAILYARD_DATA_ROOT, which the operator's --data-root sets; unset = no restriction)
  --ckpt-root DIR      the same for --ckpt-dir and a --resume PATH (default RAILYARD_CHECKPOINT_ROOT)
  --resume MODE        auto (newest valid checkpoint in --ckpt-dir; the default without --config), never, or PATH (a
                       checkpoint root or one step-N directory; default RAILYARD_RESTORE / the config's restore)
  --nproc N            launch N local processes of this command as one world (RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1,
                       MASTER_PORT = a free port); output prefixed "[rank R]"; SIGINT/SIGTERM forwarded; fails as a
                       whole when one rank fails. Under `railyard-worker agent` the world comes from the environment
  --tp T, --pp P       tensor / pipeline degree (default 1; dp = world / (T*P)); from the config's layout when given
  --zero S             ZeRO stage over the dp group: 0 off, 1 AdamW moments sharded, 2 gradients sharded too
  --deterministic      fixed reduction order independent of dp: bitwise-identical results for dp=4, dp=2 x
                       accumulation 2, dp=1 x accumulation 4 (needs a power-of-two accumulation per rank)
  --bucket-mb X        data-parallel all-reduce bucket size in MiB (default 25)
  --dp-split A0,A1,..  micro-batches per data-parallel rank for replicas of different speeds (sum = global batch /
                       micro-batch; default even); gradients are weighted by micro-batches, so any split trains the
                       same model as one process. Plain data parallelism only (no --tp/--pp/--deterministic)
  --slow-ranks R1,R2 --slow-factor F
                       TEST KNOB: ranks R1,R2 sleep (F-1) x each micro-batch's forward+backward wall time, as devices
                       F times slower would (measuring --dp-split; not for real runs; no --tp/--pp)
  --recompute MODE     activation recomputation: none (default), selective (each layer's attention probabilities are
                       recomputed in backward) or full (a layer keeps only its input and reruns its forward in
                       backward); results are bitwise unchanged, activation memory drops (docs/worker.md)
  --recompute-layers K recompute only the first K layers (default: all)
  --cp N               context parallelism: each sequence split over N ranks (ring attention), dp x cp x tp x pp =
                       world; needs T divisible by N; not with --sequence-parallel/--deterministic (docs/parallel.md)
  --sequence-parallel  Megatron sequence parallelism over the tp group (needs --tp > 1 and B*T divisible by tp):
                       layernorm/residual activations split along the tokens, all-gather/reduce-scatter instead of
                       all-reduce; same results (docs/parallel.md)
  --offload MODE       none (default) or optimizer: AdamW's moments in host memory, the update on a CPU thread
                       overlapped with the next step's forward layer by layer; results are bitwise unchanged, device
                       memory drops by 8 bytes per parameter (docs/worker.md "Optimizer offload"; not with
                       --zero/--tp/--pp)
  --offload-threads N  CPU threads of the offloaded update (default 1)
  --moe-experts E      mixture-of-experts MLP with E experts per layer (default: dense); with --nproc/--ep/--tp/--pp
  --moe-top-k K        experts per token (default 1)
  --moe-capacity-factor F  tokens per expert per micro-batch <= ceil(F * K * B*T / E); over it a token's choice is
                       dropped (its MLP contribution is 0, the residual passes); <= 0: no limit (default 1.25)
  --moe-aux-coef A     weight of the load-balancing loss A * E * sum_e f_e P_e per layer (default 0.01)
  --ep N               expert parallelism: experts split over groups of N data-parallel ranks (N divides E and dp)
  --ep-a2a ALG         flat (default) or hierarchical all_to_all for the expert dispatch/combine
  --ep-node-size G     ranks per node for --ep-a2a hierarchical (default LOCAL_WORLD_SIZE)
  --gemm-split MODE    pool (default: our threads split each GEMM over single-threaded OpenBLAS) or openblas
                       (OpenBLAS's own threads run the GEMMs); for measuring the threading choice
       railyard-worker gemm-rate [--model SPEC] [--batch B] [--seq T] [--threads N] [--split pool|openblas]
         (pool: our split over single-threaded OpenBLAS, what training uses; openblas: OpenBLAS's own threads)
)";

}  // namespace railyard::worker
