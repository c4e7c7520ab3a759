// Runtime of exported NCCL programs (synth/export/nccl_runtime.c). synth.export.nccl_c copies
// this file after a generated header and replaces the SYNTH_PLAN marker below with the plan:
// WORLD_SIZE, CHUNKS, NUM_COMMS, NUM_STEPS, REDUCTION_COMM, PROGRAM_TEXT, COMM_COLOR, COMM_KEY,
// STEP_OP, STEP_COMM, STEP_TEXT, STEP_LO, STEP_HI, STEP_ROOT. It is not compiled on its own.
//
// One process per GPU. Rank and world size come from RANK/WORLD_SIZE (torchrun, or set by
// hand), OMPI_COMM_WORLD_RANK/SIZE (mpirun), PMI_RANK/SIZE or SLURM_PROCID/NTASKS; the local
// GPU from LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID (else rank modulo the GPU
// count). Rank 0 writes the ncclUniqueId to the file SYNTH_NCCL_ID_FILE (on a file system every
// rank sees, a new path per run); the others wait for it. Every communicator is an
// ncclCommSplit of the world communicator (NCCL_SPLIT_NOCOLOR where a rank is idle), made once.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_REDUCE, OP_BROADCAST };
static const char *const OP_NAMES[] = {"AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast"};

/* SYNTH_PLAN */

#define CUDA_CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "rank %d: %s:%d: CUDA error: %s\n", g_rank, __FILE__, __LINE__, cudaGetErrorString(e_)); \
    exit(1); } } while (0)
#define NCCL_CHECK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess) { \
    fprintf(stderr, "rank %d: %s:%d: NCCL error: %s\n", g_rank, __FILE__, __LINE__, ncclGetErrorString(r_)); \
    exit(1); } } while (0)

static int g_rank = -1;

// One rank's call in one step, in elements from the buffer start (in place, NCCL layout).
struct call {
  int active, op, comm, color, key, size, root;
  size_t offset, count, send_offset, send_count, recv_offset, recv_count;
};

static struct call plan_call(int step, int rank, size_t chunk) {
  struct call c;
  memset(&c, 0, sizeof c);
  c.op = STEP_OP[step];
  c.comm = STEP_COMM[step];
  c.root = STEP_ROOT[step][rank];
  c.color = COMM_COLOR[c.comm][rank];
  c.key = COMM_KEY[c.comm][rank];
  if (STEP_LO[step][rank] < 0 || c.color < 0) return c;  // idle in this step
  c.active = 1;
  for (int r = 0; r < WORLD_SIZE; r++) c.size += COMM_COLOR[c.comm][r] == c.color;
  c.offset = (size_t)STEP_LO[step][rank] * chunk;
  c.count = (size_t)(STEP_HI[step][rank] - STEP_LO[step][rank]) * chunk;
  size_t block = c.count / (size_t)c.size;
  c.send_offset = c.recv_offset = c.offset;
  c.send_count = c.recv_count = c.count;
  if (c.op == OP_REDUCE_SCATTER) {
    c.recv_offset = c.offset + (size_t)c.key * block;
    c.recv_count = block;
  } else if (c.op == OP_ALL_GATHER) {
    c.send_offset = c.offset + (size_t)c.key * block;
    c.send_count = block;
  }
  return c;
}

static void run_step(int step, float *buf, size_t chunk, ncclComm_t *comms, cudaStream_t stream) {
  struct call c = plan_call(step, g_rank, chunk);
  if (!c.active) return;
  ncclComm_t comm = comms[c.comm];
  switch (c.op) {
    case OP_ALL_REDUCE:
      NCCL_CHECK(ncclAllReduce(buf + c.offset, buf + c.offset, c.count, ncclFloat, ncclSum, comm, stream));
      break;
    case OP_REDUCE_SCATTER:  // in place: recvbuff = sendbuff + key * recvcount
      NCCL_CHECK(ncclReduceScatter(buf + c.send_offset, buf + c.recv_offset, c.recv_count, ncclFloat, ncclSum, comm, stream));
      break;
    case OP_ALL_GATHER:  // in place: sendbuff = recvbuff + key * sendcount
      NCCL_CHECK(ncclAllGather(buf + c.send_offset, buf + c.recv_offset, c.send_count, ncclFloat, comm, stream));
      break;
    case OP_REDUCE:
      NCCL_CHECK(ncclReduce(buf + c.offset, buf + c.offset, c.count, ncclFloat, ncclSum, c.root, comm, stream));
      break;
    case OP_BROADCAST:
      NCCL_CHECK(ncclBroadcast(buf + c.offset, buf + c.offset, c.count, ncclFloat, c.root, comm, stream));
      break;
  }
}

static void run_program(float *buf, size_t chunk, ncclComm_t *comms, cudaStream_t stream) {
  for (int s = 0; s < NUM_STEPS; s++) run_step(s, buf, chunk, comms, stream);
}

static int env_int(const char *const *names, int fallback) {
  for (; *names; names++) {
    const char *value = getenv(*names);
    if (value && *value) return atoi(value);
  }
  return fallback;
}

static long long parse_size(const char *text) {
  char *end;
  long long value = strtoll(text, &end, 10);
  long long scale = 1;
  if (!strcmp(end, "") || !strcmp(end, "B")) scale = 1;
  else if (!strcmp(end, "KiB") || !strcmp(end, "Ki")) scale = 1LL << 10;
  else if (!strcmp(end, "MiB") || !strcmp(end, "Mi")) scale = 1LL << 20;
  else if (!strcmp(end, "GiB") || !strcmp(end, "Gi")) scale = 1LL << 30;
  else if (!strcmp(end, "kB") || !strcmp(end, "k") || !strcmp(end, "K")) scale = 1000LL;
  else if (!strcmp(end, "MB") || !strcmp(end, "M")) scale = 1000000LL;
  else if (!strcmp(end, "GB") || !strcmp(end, "G")) scale = 1000000000LL;
  else value = -1;
  return value > 0 ? value * scale : -1;
}

static void usage(const char *program) {
  fprintf(stderr,
          "usage: %s [--bytes S] [--iters I] [--warmup W] [--check] [--dry-run]\n"
          "  one process per GPU; %d processes in all; see the comment at the top of the source\n",
          program, WORLD_SIZE);
}

static void read_unique_id(ncclUniqueId *id) {
  const char *path = getenv("SYNTH_NCCL_ID_FILE");
  if (!path || !*path) {
    fprintf(stderr, "rank %d: set SYNTH_NCCL_ID_FILE to a new path on a file system every rank sees\n", g_rank);
    exit(2);
  }
  if (g_rank == 0) {
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    NCCL_CHECK(ncclGetUniqueId(id));
    FILE *f = fopen(tmp, "wb");
    if (!f || fwrite(id, sizeof *id, 1, f) != 1 || fclose(f) != 0 || rename(tmp, path) != 0) {
      fprintf(stderr, "rank 0: cannot write %s: %s\n", path, strerror(errno));
      exit(1);
    }
    return;
  }
  for (int waited = 0; waited < 3000; waited++) {  // up to 300 s
    FILE *f = fopen(path, "rb");
    if (f) {
      size_t got = fread(id, sizeof *id, 1, f);
      fclose(f);
      if (got == 1) return;
    }
    struct timespec pause = {0, 100000000};
    nanosleep(&pause, NULL);
  }
  fprintf(stderr, "rank %d: %s did not appear within 300 s: is rank 0 running with the same path?\n", g_rank, path);
  exit(1);
}

// Small integers, exact in float sums, different per rank and element (as the torch export).
static void fill(float *host, size_t count, int rank) {
  for (size_t i = 0; i < count; i++) {
    long long v = ((long long)i * 7 + (long long)rank * 13 + (long long)(i / 5) * rank) % 17 - 8;
    host[i] = (float)v;
  }
}

static double over_ranks(double value, ncclRedOp_t op, ncclComm_t world, cudaStream_t stream) {
  double *device;
  CUDA_CHECK(cudaMalloc((void **)&device, sizeof value));
  CUDA_CHECK(cudaMemcpy(device, &value, sizeof value, cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclAllReduce(device, device, 1, ncclDouble, op, world, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaMemcpy(&value, device, sizeof value, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(device));
  return value;
}

static void print_row(size_t bytes, size_t count, double seconds, long long wrong, int checked) {
  double n = (double)CHUNKS;
  double algbw = (double)bytes / seconds / 1e9;
  double busbw = algbw * 2.0 * (n - 1.0) / n;
  if (checked) printf("%14zu %12zu %6s %6s %11.2f %9.3f %9.3f %7lld\n", bytes, count, "float", "sum", seconds * 1e6, algbw, busbw, wrong);
  else printf("%14zu %12zu %6s %6s %11.2f %9.3f %9.3f %7s\n", bytes, count, "float", "sum", seconds * 1e6, algbw, busbw, "N/A");
}

int main(int argc, char **argv) {
  long long nbytes = 32LL << 20;
  int iters = 20, warmup = 5, check = 0, dry_run = 0;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--bytes") && i + 1 < argc) nbytes = parse_size(argv[++i]);
    else if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--check")) check = 1;
    else if (!strcmp(argv[i], "--dry-run")) dry_run = 1;
    else { usage(argv[0]); return 2; }
  }
  if (nbytes <= 0 || iters < 1 || warmup < 0) { usage(argv[0]); return 2; }

  static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
  static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
  static const char *const local_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", NULL};
  g_rank = env_int(rank_vars, -1);
  int world = env_int(size_vars, -1);
  if (g_rank < 0 || world < 0) {
    fprintf(stderr, "set RANK and WORLD_SIZE (or run under mpirun or srun): one process per GPU, %d in all\n", WORLD_SIZE);
    return 2;
  }
  if (world != WORLD_SIZE || g_rank >= WORLD_SIZE) {
    fprintf(stderr, "this program was generated for %d ranks; WORLD_SIZE is %d (rank %d)\n", WORLD_SIZE, world, g_rank);
    return 2;
  }
  size_t per_chunk = (size_t)((nbytes + 4LL * CHUNKS - 1) / (4LL * CHUNKS));
  if (per_chunk == 0) per_chunk = 1;
  size_t count = per_chunk * CHUNKS;
  size_t bytes = count * sizeof(float);

  if (dry_run) {  // print this rank's calls without touching a GPU
    printf("rank %d world %d chunks %d count %zu\n", g_rank, WORLD_SIZE, CHUNKS, count);
    for (int s = 0; s < NUM_STEPS; s++) {
      struct call c = plan_call(s, g_rank, per_chunk);
      if (!c.active) { printf("step %d %s idle  # %s\n", s, OP_NAMES[STEP_OP[s]], STEP_TEXT[s]); continue; }
      printf("step %d %s comm %d color %d key %d size %d offset %zu count %zu send %zu %zu recv %zu %zu root %d  # %s\n",
             s, OP_NAMES[c.op], c.comm, c.color, c.key, c.size, c.offset, c.count,
             c.send_offset, c.send_count, c.recv_offset, c.recv_count, c.root, STEP_TEXT[s]);
    }
    return 0;
  }

  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  int local = env_int(local_vars, g_rank % (devices > 0 ? devices : 1));
  CUDA_CHECK(cudaSetDevice(local));
  ncclUniqueId id;
  read_unique_id(&id);
  ncclComm_t world_comm;
  NCCL_CHECK(ncclCommInitRank(&world_comm, WORLD_SIZE, id, g_rank));
  if (g_rank == 0) unlink(getenv("SYNTH_NCCL_ID_FILE"));  // every rank has read it by now
  ncclComm_t comms[NUM_COMMS];
  for (int c = 0; c < NUM_COMMS; c++) {  // collective over the world: every rank, same order
    int color = COMM_COLOR[c][g_rank] < 0 ? NCCL_SPLIT_NOCOLOR : COMM_COLOR[c][g_rank];
    int key = COMM_KEY[c][g_rank] < 0 ? 0 : COMM_KEY[c][g_rank];
    NCCL_CHECK(ncclCommSplit(world_comm, color, key, &comms[c], NULL));
    if (color != NCCL_SPLIT_NOCOLOR) {
      int user_rank = -1;
      NCCL_CHECK(ncclCommUserRank(comms[c], &user_rank));
      if (user_rank != key) {
        fprintf(stderr, "rank %d: communicator %d gave rank %d, the plan needs %d\n", g_rank, c, user_rank, key);
        return 1;
      }
    }
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  float *buf, *expected, *host = (float *)malloc(bytes), *result = (float *)malloc(bytes);
  if (!host || !result) { fprintf(stderr, "rank %d: out of host memory\n", g_rank); return 1; }
  CUDA_CHECK(cudaMalloc((void **)&buf, bytes));
  CUDA_CHECK(cudaMalloc((void **)&expected, bytes));

  long long wrong = 0;
  if (check) {
    fill(host, count, g_rank);
    CUDA_CHECK(cudaMemcpy(buf, host, bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(expected, host, bytes, cudaMemcpyHostToDevice));
    NCCL_CHECK(ncclAllReduce(expected, expected, count, ncclFloat, ncclSum, comms[REDUCTION_COMM], stream));
    run_program(buf, per_chunk, comms, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    CUDA_CHECK(cudaMemcpy(result, buf, bytes, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(host, expected, bytes, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < count; i++) wrong += result[i] != host[i];
    wrong = (long long)over_ranks((double)wrong, ncclSum, world_comm, stream);
  }

  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  CUDA_CHECK(cudaMemset(buf, 0, bytes));
  double seconds[2];
  for (int which = 0; which < 2; which++) {  // 0: the program, 1: the baseline all-reduce
    for (int i = 0; i < warmup + iters; i++) {
      if (i == warmup) CUDA_CHECK(cudaEventRecord(start, stream));
      if (which == 0) run_program(buf, per_chunk, comms, stream);
      else NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comms[REDUCTION_COMM], stream));
    }
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    seconds[which] = over_ranks(ms / 1e3 / iters, ncclMax, world_comm, stream);  // the slowest rank
  }
  if (g_rank == 0) {
    printf("# program: %s\n# %d ranks, reduction groups of n = %d, %d iteration(s) after %d warm-up run(s)\n",
           PROGRAM_TEXT, WORLD_SIZE, CHUNKS, iters, warmup);
    if ((long long)bytes != nbytes)
      printf("# %lld B is not %d chunks of whole float elements: rounded up to %zu B\n", nbytes, CHUNKS, bytes);
    printf("#%13s %12s %6s %6s %11s %9s %9s %7s\n", "size(B)", "count", "type", "redop", "time(us)", "algbw", "busbw", "#wrong");
    print_row(bytes, count, seconds[0], wrong, check);
    printf("# baseline: one ncclAllReduce over each reduction group\n");
    print_row(bytes, count, seconds[1], 0, 0);
    if (check) printf(wrong ? "# CHECK FAILED\n" : "# check passed\n");
  }
  CUDA_CHECK(cudaFree(buf));
  CUDA_CHECK(cudaFree(expected));
  free(host);
  free(result);
  for (int c = 0; c < NUM_COMMS; c++)
    if (COMM_COLOR[c][g_rank] >= 0) NCCL_CHECK(ncclCommDestroy(comms[c]));
  NCCL_CHECK(ncclCommDestroy(world_comm));
  return wrong ? 1 : 0;
}
