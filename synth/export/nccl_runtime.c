// Runtime of exported NCCL programs (synth/export/nccl_runtime.c). synth.export.nccl_c copies
// this file after a generated header and replaces the SYNTH_PLAN marker below with the plan:
// WORLD_SIZE, CHUNKS, NUM_COMMS, NUM_STEPS, REDUCTION_COMM, GOAL_OP, GOAL_NAME, FINAL_PLACES,
// PROGRAM_TEXT, COMM_COLOR, COMM_KEY, STEP_OP, STEP_COMM, STEP_TEXT, STEP_LO, STEP_HI, STEP_ROOT,
// STEP_PLACES. It is not compiled on its own.
//
// The goal (GOAL_OP) is the collective the program computes over each reduction group: its
// --check compares with NCCL's own call of it (ncclAllReduce, ncclReduceScatter, ncclAllGather,
// grouped ncclSend/ncclRecv for all-to-all, ncclBroadcast or ncclReduce from key 0) on the same
// input, and the baseline rows time that call. A Permute step (OP_PERMUTE) is local: every rank
// moves the chunk at place p of its buffer to place STEP_PLACES[step][p] (device-to-device copies
// through a scratch buffer). A reduce-scatter's result, block `key` of the sum, is at place
// FINAL_PLACES[key] of the buffer after the program.
//
// One process per GPU. Rank and world size come from RANK/WORLD_SIZE (torchrun, or set by
// hand), OMPI_COMM_WORLD_RANK/SIZE (mpirun), PMI_RANK/SIZE or SLURM_PROCID/NTASKS; the local
// GPU from LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK or SLURM_LOCALID (else rank modulo the GPU
// count; ranks sharing a GPU each get their own NCCL_HOSTID). Rank 0 writes the ncclUniqueId to the file SYNTH_NCCL_ID_FILE (on a file system every
// rank sees, a new path per run); the others wait for it. Every communicator is an
// ncclCommSplit of the world communicator (NCCL_SPLIT_NOCOLOR where a rank is idle), made once,
// finalized and destroyed at the end. Every wait polls NCCL's asynchronous errors: when a peer
// fails, the communicators are aborted and the rank exits 1 instead of waiting forever.
// Output is nccl-tests' table and "Avg bus bandwidth" line, with -n/-w/-b/-e/-f/-d/-c as there.
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

enum { OP_ALL_REDUCE, OP_REDUCE_SCATTER, OP_ALL_GATHER, OP_REDUCE, OP_BROADCAST, OP_ALL_TO_ALL, OP_PERMUTE };
static const char *const OP_NAMES[] = {"AllReduce", "ReduceScatter", "AllGather", "Reduce", "Broadcast", "AllToAll",
                                       "Permute"};
static const char *const OP_NCCL_NAMES[] = {"ncclAllReduce", "ncclReduceScatter", "ncclAllGather", "ncclReduce",
                                            "ncclBroadcast", "grouped ncclSend/ncclRecv", ""};

/* SYNTH_PLAN */

static int g_rank = -1;
static ncclComm_t g_comms[NUM_COMMS + 1];  // every communicator made so far, aborted on failure
static int g_num_comms = 0;

// On any failure: abort every communicator (so no NCCL call waits for this rank forever and
// the other ranks see an error instead of a hang), then exit.
static void fail(int code) {
  for (int c = g_num_comms - 1; c >= 0; c--) ncclCommAbort(g_comms[c]);
  g_num_comms = 0;
  exit(code);
}

#define CUDA_CHECK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    fprintf(stderr, "rank %d: %s:%d: CUDA error: %s\n", g_rank, __FILE__, __LINE__, cudaGetErrorString(e_)); \
    fail(1); } } while (0)
#define NCCL_CHECK(call) do { ncclResult_t r_ = (call); if (r_ != ncclSuccess && r_ != ncclInProgress) { \
    fprintf(stderr, "rank %d: %s:%d: NCCL error: %s (%s)\n", g_rank, __FILE__, __LINE__, ncclGetErrorString(r_), \
            ncclGetLastError(NULL)); \
    fail(1); } } while (0)

// Element types, by nccl-tests' -d names.
enum { TYPE_FLOAT, TYPE_HALF, TYPE_BFLOAT16 };
static const char *const TYPE_NAMES[] = {"float", "half", "bfloat16"};
static const ncclDataType_t TYPE_NCCL[] = {ncclFloat, ncclHalf, ncclBfloat16};
static const size_t TYPE_SIZE[] = {4, 2, 2};

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
  if (c.op == OP_PERMUTE) return c;  // local: no communicator, no call
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

// A device buffer of at least `bytes` (AllToAll receives into it: NCCL has no in-place all-to-all).
static char *scratch_of(size_t bytes) {
  static char *scratch = NULL;
  static size_t held = 0;
  if (bytes > held) {
    if (scratch) CUDA_CHECK(cudaFree(scratch));
    CUDA_CHECK(cudaMalloc((void **)&scratch, bytes));
    held = bytes;
  }
  return scratch;
}

// One NCCL call as `c` describes it, on `buf`; `out` (NULL: in place, buf) takes the output of an
// out-of-place call at the same offsets (the baseline's out-of-place rows).
static void issue(const struct call *c, char *buf, char *out, int type, ncclComm_t comm, cudaStream_t stream) {
  ncclDataType_t t = TYPE_NCCL[type];
  size_t z = TYPE_SIZE[type];
  char *dst = out ? out : buf;
  char *at = buf + c->offset * z, *send = buf + c->send_offset * z, *recv = dst + c->recv_offset * z;
  switch (c->op) {
    case OP_ALL_REDUCE:
      NCCL_CHECK(ncclAllReduce(at, dst + c->offset * z, c->count, t, ncclSum, comm, stream));
      break;
    case OP_REDUCE_SCATTER:  // in place: recvbuff = sendbuff + key * recvcount
      NCCL_CHECK(ncclReduceScatter(send, recv, c->recv_count, t, ncclSum, comm, stream));
      break;
    case OP_ALL_GATHER:  // in place: sendbuff = recvbuff + key * sendcount
      NCCL_CHECK(ncclAllGather(send, recv, c->send_count, t, comm, stream));
      break;
    case OP_REDUCE:
      NCCL_CHECK(ncclReduce(at, dst + c->offset * z, c->count, t, ncclSum, c->root, comm, stream));
      break;
    case OP_BROADCAST:
      NCCL_CHECK(ncclBroadcast(at, dst + c->offset * z, c->count, t, c->root, comm, stream));
      break;
    case OP_ALL_TO_ALL: {  // as NCCL runs all-to-all: one grouped send/recv with every peer
      size_t block = c->count / (size_t)c->size;
      char *into = out ? out + c->offset * z : scratch_of(c->count * z);
      NCCL_CHECK(ncclGroupStart());
      for (int peer = 0; peer < c->size; peer++) {
        NCCL_CHECK(ncclSend(at + (size_t)peer * block * z, block, t, peer, comm, stream));
        NCCL_CHECK(ncclRecv(into + (size_t)peer * block * z, block, t, peer, comm, stream));
      }
      NCCL_CHECK(ncclGroupEnd());
      if (!out) CUDA_CHECK(cudaMemcpyAsync(at, into, c->count * z, cudaMemcpyDeviceToDevice, stream));
      break;
    }
  }
}

// A Permute step, as the torch runtime's: the chunk at place p moves to place places[p], every
// chunk of the buffer (those the rank does not hold carry nothing the program reads); copies at
// memory bandwidth into the scratch buffer, then one copy back.
static void permute(const int *places, char *buf, size_t chunk, int type, cudaStream_t stream) {
  size_t bytes = chunk * TYPE_SIZE[type];
  char *scratch = scratch_of(bytes * CHUNKS);
  for (int p = 0; p < CHUNKS; p++)
    CUDA_CHECK(cudaMemcpyAsync(scratch + (size_t)places[p] * bytes, buf + (size_t)p * bytes, bytes,
                               cudaMemcpyDeviceToDevice, stream));
  CUDA_CHECK(cudaMemcpyAsync(buf, scratch, bytes * CHUNKS, cudaMemcpyDeviceToDevice, stream));
}

static void run_step(int step, char *buf, size_t chunk, int type, ncclComm_t *comms, cudaStream_t stream) {
  if (STEP_OP[step] == OP_PERMUTE) {
    permute(STEP_PLACES[step], buf, chunk, type, stream);
    return;
  }
  struct call c = plan_call(step, g_rank, chunk);
  if (c.active) issue(&c, buf, NULL, type, comms[c.comm], stream);
}

// The goal's own NCCL call over this rank's reduction group, on the whole buffer (root: key 0).
static struct call goal_call(size_t chunk) {
  struct call c;
  memset(&c, 0, sizeof c);
  c.active = 1;
  c.op = GOAL_OP;
  c.comm = REDUCTION_COMM;
  c.color = COMM_COLOR[REDUCTION_COMM][g_rank];
  c.key = COMM_KEY[REDUCTION_COMM][g_rank];
  c.size = CHUNKS;
  c.count = chunk * CHUNKS;
  c.send_offset = c.recv_offset = 0;
  c.send_count = c.recv_count = c.count;
  if (c.op == OP_REDUCE_SCATTER) { c.recv_offset = (size_t)c.key * chunk; c.recv_count = chunk; }
  if (c.op == OP_ALL_GATHER) { c.send_offset = (size_t)c.key * chunk; c.send_count = chunk; }
  return c;
}

static void run_program(char *buf, size_t chunk, int type, ncclComm_t *comms, cudaStream_t stream) {
  for (int s = 0; s < NUM_STEPS; s++) run_step(s, buf, chunk, type, comms, stream);
}

static int env_int(const char *const *names, int fallback) {
  for (; *names; names++) {
    const char *value = getenv(*names);
    if (value && *value) return atoi(value);
  }
  return fallback;
}

// Bytes, as synth's --bytes reads them (synth/units.py; the tests hold the two equal):
// nccl-tests' 8M or 1G (a bare K, M, G or T in either case: binary), 64KiB/32MiB (binary),
// 1MB/1kB (decimal), 1048576; a whole number from 1 byte to 1 PiB, else -1.
#define MAX_BYTES (1LL << 50)
static long double power(long double base, int exponent) {
  long double result = 1;
  while (exponent-- > 0) result *= base;
  return result;
}

// A size as synth's --bytes reads it (synth/units.py); `flag` (-b/-e, nccl-tests' flags): as
// nccl-tests reads them, the letter after the number decides, so 1MB is 2^20 there.
static long long parse_size(const char *text, int flag) {
  char *end;
  while (*text == ' ') text++;
  if (!*text || *text == '-') return -1;
  long double value = strtold(text, &end);
  if (end == text) return -1;
  while (*end == ' ') end++;
  char unit[8] = {0};
  size_t length = strlen(end);
  while (length > 0 && end[length - 1] == ' ') length--;
  if (length >= sizeof unit) return -1;
  memcpy(unit, end, length);
  long double scale = -1;
  static const char *const binary[] = {"K", "M", "G", "T", NULL};
  static const char *const iec[] = {"KiB", "MiB", "GiB", "TiB", "PiB", NULL};
  static const char *const si[] = {"kB", "MB", "GB", "TB", "PB", NULL};
  if (length == 0 || !strcmp(unit, "B")) scale = 1;
  for (int i = 0; binary[i]; i++)
    if (length == 1 && (unit[0] == binary[i][0] || unit[0] == binary[i][0] + ('a' - 'A'))) scale = power(1024.0L, i + 1);
  for (int i = 0; iec[i]; i++)
    if (!strcmp(unit, iec[i])) scale = power(1024.0L, i + 1);
  for (int i = 0; si[i]; i++)
    if (!strcmp(unit, si[i]) || (i == 0 && !strcmp(unit, "KB"))) scale = power(1000.0L, i + 1);
  if (flag && length >= 1) {
    const char *rest = unit + 1, *letters = "KMGTP";
    for (int i = 0; letters[i]; i++)
      if ((unit[0] == letters[i] || unit[0] == letters[i] + ('a' - 'A')) &&
          (!strcmp(rest, "") || !strcmp(rest, "B") || !strcmp(rest, "iB")))
        scale = power(1024.0L, i + 1);
  }
  if (scale < 0 || !(value > 0) || !(value * scale <= (long double)MAX_BYTES)) return -1;
  long double bytes = value * scale;
  if (bytes != (long double)(long long)bytes) return -1;
  return (long long)bytes;
}

static void usage(const char *program) {
  fprintf(stderr,
          "usage: %s [--bytes S | -b MIN -e MAX [-f F]] [-n ITERS] [-w WARMUP] [-d float|half|bfloat16] [--check] [--dry-run]\n"
          "  sizes as nccl-tests (8M = 8 MiB) or with a unit (64KiB, 1MB); one process per GPU, %d in all;\n"
          "  see the comment at the top of the source\n",
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

// Wait for the stream without trusting it to finish: a peer that died leaves NCCL waiting, so
// poll each communicator's asynchronous error, and give up after SYNTH_NCCL_TIMEOUT seconds
// (default 600); either way abort every communicator and exit 1.
static void wait_stream(cudaStream_t stream) {
  const char *limit_text = getenv("SYNTH_NCCL_TIMEOUT");
  double limit = limit_text && *limit_text ? atof(limit_text) : 600.0;
  struct timespec start, now, pause = {0, 100000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    cudaError_t state = cudaStreamQuery(stream);
    if (state == cudaSuccess) return;
    if (state != cudaErrorNotReady) CUDA_CHECK(state);
    for (int c = 0; c < g_num_comms; c++) {
      ncclResult_t result = ncclSuccess;
      NCCL_CHECK(ncclCommGetAsyncError(g_comms[c], &result));
      if (result != ncclSuccess && result != ncclInProgress) {
        fprintf(stderr, "rank %d: NCCL reported %s (%s): a peer failed; aborting\n", g_rank,
                ncclGetErrorString(result), ncclGetLastError(NULL));
        fail(1);
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec) > limit) {
      fprintf(stderr, "rank %d: no progress in %.0f s (SYNTH_NCCL_TIMEOUT): a peer is gone or stuck; aborting\n",
              g_rank, limit);
      fail(1);
    }
    nanosleep(&pause, NULL);
  }
}

// float <-> half and bfloat16 on the host, for the small integers the check uses (exact).
static unsigned short to_half(float f) {
  unsigned int x;
  memcpy(&x, &f, sizeof x);
  unsigned int sign = (x >> 16) & 0x8000u, exponent = (x >> 23) & 0xffu, mantissa = x & 0x7fffffu;
  if (exponent == 0) return (unsigned short)sign;  // zero (no subnormals needed here)
  return (unsigned short)(sign | ((exponent - 112u) << 10) | (mantissa >> 13));
}
static float from_half(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16, exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
  unsigned int x = exponent == 0 ? sign : (sign | ((exponent + 112u) << 23) | (mantissa << 13));
  float f;
  memcpy(&f, &x, sizeof f);
  return f;
}
static void put(char *host, size_t i, int type, float value) {
  if (type == TYPE_FLOAT) { memcpy(host + 4 * i, &value, 4); return; }
  unsigned short bits;
  if (type == TYPE_HALF) bits = to_half(value);
  else { unsigned int x; memcpy(&x, &value, 4); bits = (unsigned short)(x >> 16); }
  memcpy(host + 2 * i, &bits, 2);
}
static float get(const char *host, size_t i, int type) {
  float value;
  if (type == TYPE_FLOAT) { memcpy(&value, host + 4 * i, 4); return value; }
  unsigned short bits;
  memcpy(&bits, host + 2 * i, 2);
  if (type == TYPE_HALF) return from_half(bits);
  unsigned int x = (unsigned int)bits << 16;
  memcpy(&value, &x, 4);
  return value;
}

// Small integers, exact in sums of every type, different per rank and element (as the torch export).
static void fill(char *host, size_t count, int rank, int type) {
  for (size_t i = 0; i < count; i++) {
    long long v = ((long long)i * 7 + (long long)rank * 13 + (long long)(i / 5) * rank) % 17 - 8;
    put(host, i, type, (float)v);
  }
}

static double over_ranks(double value, ncclRedOp_t op, ncclComm_t world, cudaStream_t stream) {
  double *device;
  CUDA_CHECK(cudaMalloc((void **)&device, sizeof value));
  CUDA_CHECK(cudaMemcpy(device, &value, sizeof value, cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclAllReduce(device, device, 1, ncclDouble, op, world, stream));
  wait_stream(stream);
  CUDA_CHECK(cudaMemcpy(&value, device, sizeof value, cudaMemcpyDeviceToHost));
  CUDA_CHECK(cudaFree(device));
  return value;
}

static void barrier(ncclComm_t world, cudaStream_t stream) { over_ranks(0.0, ncclSum, world, stream); }

// Mean seconds per run of `which` (0: the program, 1: the goal's NCCL call in place, 2: out of place),
// the slowest rank's, timed with CUDA events after warm-up runs and a barrier.
static double timed(int which, char *buf, char *out, size_t chunk, int type, int iters, int warmup,
                    ncclComm_t *comms, ncclComm_t world, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < warmup + iters; i++) {
    if (i == warmup) {
      wait_stream(stream);
      barrier(world, stream);
      CUDA_CHECK(cudaEventRecord(start, stream));
    }
    if (which == 0) run_program(buf, chunk, type, comms, stream);
    else {
      struct call c = goal_call(chunk);
      issue(&c, buf, which == 1 ? NULL : out, type, comms[REDUCTION_COMM], stream);
    }
  }
  CUDA_CHECK(cudaEventRecord(stop, stream));
  wait_stream(stream);
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  return over_ranks(ms / 1e3 / iters, ncclMax, world, stream);
}

static void print_header(void) {
  printf("#%47s %31s %31s\n", "", "out-of-place        ", "in-place           ");
  printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "size", "count", "type", "redop", "root",
         "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  printf("#%11s %12s %8s %6s %6s %8s %7s %7s %6s %8s %7s %7s %6s\n", "(B)", "(elements)", "", "", "",
         "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
}

// One nccl-tests row; seconds < 0 prints N/A (programs run in place only), wrong < 0 too.
static double print_row(size_t bytes, size_t count, int type, double out_seconds, double in_seconds,
                        long long wrong) {
  // nccl-tests' busbw / algbw for the goal's collective (doc/PERFORMANCE.md)
  double n = (double)CHUNKS, busbw = 0;
  double factor = GOAL_OP == OP_ALL_REDUCE ? 2.0 * (n - 1.0) / n
                  : GOAL_OP == OP_BROADCAST || GOAL_OP == OP_REDUCE ? 1.0 : (n - 1.0) / n;
  int rooted = GOAL_OP == OP_BROADCAST || GOAL_OP == OP_REDUCE;
  printf("%12zu %12zu %8s %6s %6d ", bytes, count, TYPE_NAMES[type], GOAL_OP == OP_ALL_REDUCE || GOAL_OP == OP_REDUCE_SCATTER || GOAL_OP == OP_REDUCE ? "sum" : "none",
         rooted ? 0 : -1);
  char wrong_text[32];
  if (wrong < 0) snprintf(wrong_text, sizeof wrong_text, "N/A");
  else snprintf(wrong_text, sizeof wrong_text, "%lld", wrong);
  if (out_seconds < 0) printf("%8s %7s %7s %6s ", "N/A", "N/A", "N/A", "N/A");
  else {
    double algbw = (double)bytes / out_seconds / 1e9;
    printf("%8.2f %7.2f %7.2f %6s ", out_seconds * 1e6, algbw, algbw * factor, "N/A");
  }
  double algbw = (double)bytes / in_seconds / 1e9;
  busbw = algbw * factor;
  printf("%8.2f %7.2f %7.2f %6s\n", in_seconds * 1e6, algbw, busbw, wrong_text);
  return busbw;
}

// Release a communicator as NCCL asks: finalize (flush its outstanding work), then destroy.
static void release(ncclComm_t comm) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  NCCL_CHECK(ncclCommFinalize(comm));
#endif
  NCCL_CHECK(ncclCommDestroy(comm));
}

int main(int argc, char **argv) {
  long long low = 32LL << 20, high = 32LL << 20;
  int iters = 20, warmup = 5, check = 0, dry_run = 0, type = TYPE_FLOAT, sweep = 0, sized = 0;
  long long factor = 2;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *value = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--bytes") && value) { low = high = parse_size(value, 0); sized = 1; i++; }
    else if ((!strcmp(a, "-b") || !strcmp(a, "--minbytes")) && value) { low = parse_size(value, 1); sweep |= 1; i++; }
    else if ((!strcmp(a, "-e") || !strcmp(a, "--maxbytes")) && value) { high = parse_size(value, 1); sweep |= 2; i++; }
    else if ((!strcmp(a, "-f") || !strcmp(a, "--stepfactor")) && value) { factor = atoll(value); i++; }
    else if ((!strcmp(a, "-n") || !strcmp(a, "--iters")) && value) { iters = atoi(value); i++; }
    else if ((!strcmp(a, "-w") || !strcmp(a, "--warmup")) && value) { warmup = atoi(value); i++; }
    else if ((!strcmp(a, "-c") || !strcmp(a, "--check")) && value && (!strcmp(value, "0") || !strcmp(value, "1"))) { check = atoi(value); i++; }
    else if (!strcmp(a, "--check")) check = 1;
    else if (!strcmp(a, "--dry-run")) dry_run = 1;
    else if ((!strcmp(a, "-d") || !strcmp(a, "--dtype")) && value) {
      type = -1;
      for (int t = 0; t < 3; t++) if (!strcmp(value, TYPE_NAMES[t])) type = t;
      if (type < 0) { usage(argv[0]); return 2; }
      i++;
    } else { usage(argv[0]); return 2; }
  }
  if (low <= 0 || high <= 0) {
    fprintf(stderr, "%s: invalid size: give bytes from 1 to 1 PiB, e.g. 32M (nccl-tests: binary), 32MiB or 1048576\n",
            argv[0]);
    return 2;
  }
  if (iters < 1 || warmup < 0 || factor < 2 || low > high || (sized && sweep) ||
      (sweep && sweep != 3)) {
    usage(argv[0]);
    return 2;
  }

  static const char *const rank_vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID", NULL};
  static const char *const size_vars[] = {"WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", NULL};
  static const char *const local_vars[] = {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", NULL};
  static const char *const local_size_vars[] = {"LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                                                "SLURM_NTASKS_PER_NODE", NULL};
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
  size_t z = TYPE_SIZE[type];

  if (dry_run) {  // print this rank's calls without touching a GPU
    size_t per_chunk = (size_t)((low + (long long)z * CHUNKS - 1) / ((long long)z * CHUNKS));
    if (per_chunk == 0) per_chunk = 1;
    printf("rank %d world %d chunks %d count %zu\n", g_rank, WORLD_SIZE, CHUNKS, per_chunk * CHUNKS);
    printf("collective %s final_places", GOAL_NAME);
    for (int p = 0; p < CHUNKS && FINAL_PLACES[0] >= 0; p++) printf(" %d", FINAL_PLACES[p]);
    printf("\n");
    for (int s = 0; s < NUM_STEPS; s++) {
      if (STEP_OP[s] == OP_PERMUTE) {
        printf("step %d Permute places", s);
        for (int p = 0; p < CHUNKS; p++) printf(" %d", STEP_PLACES[s][p]);
        printf("  # %s\n", STEP_TEXT[s]);
        continue;
      }
      struct call c = plan_call(s, g_rank, per_chunk);
      if (!c.active) { printf("step %d %s idle  # %s\n", s, OP_NAMES[STEP_OP[s]], STEP_TEXT[s]); continue; }
      printf("step %d %s comm %d color %d key %d size %d offset %zu count %zu send %zu %zu recv %zu %zu root %d  # %s\n",
             s, OP_NAMES[c.op], c.comm, c.color, c.key, c.size, c.offset, c.count,
             c.send_offset, c.send_count, c.recv_offset, c.recv_count, c.root, STEP_TEXT[s]);
    }
    return 0;
  }

  int devices = 0;
  cudaError_t found = cudaGetDeviceCount(&devices);
  if (found != cudaSuccess || devices < 1) {
    fprintf(stderr, "rank %d: no usable GPU (%s): run it on a machine with a GPU, or --dry-run here\n", g_rank,
            found != cudaSuccess ? cudaGetErrorString(found) : "none visible");
    return 2;
  }
  int local = env_int(local_vars, g_rank) % devices;
  int local_world = env_int(local_size_vars, 1);
  int shared = 0;
  if (local_world > devices && !getenv("NCCL_HOSTID")) {
    // Several ranks on one GPU: NCCL refuses two ranks of one host on one device, so give
    // each rank its own host id; NCCL then connects them over its socket transport.
    static char hostid[64];
    snprintf(hostid, sizeof hostid, "synth-rank-%d", g_rank);
    setenv("NCCL_HOSTID", hostid, 1);
    shared = 1;
  }
  CUDA_CHECK(cudaSetDevice(local));
  ncclUniqueId id;
  read_unique_id(&id);
  ncclComm_t world_comm;
  NCCL_CHECK(ncclCommInitRank(&world_comm, WORLD_SIZE, id, g_rank));
  g_comms[g_num_comms++] = world_comm;
  if (g_rank == 0) unlink(getenv("SYNTH_NCCL_ID_FILE"));  // every rank has read it by now
  ncclComm_t comms[NUM_COMMS];
  for (int c = 0; c < NUM_COMMS; c++) {  // collective over the world: every rank, same order
    int color = COMM_COLOR[c][g_rank] < 0 ? NCCL_SPLIT_NOCOLOR : COMM_COLOR[c][g_rank];
    int key = COMM_KEY[c][g_rank] < 0 ? 0 : COMM_KEY[c][g_rank];
    comms[c] = NULL;
    NCCL_CHECK(ncclCommSplit(world_comm, color, key, &comms[c], NULL));
    if (color != NCCL_SPLIT_NOCOLOR) {
      g_comms[g_num_comms++] = comms[c];
      int user_rank = -1;
      NCCL_CHECK(ncclCommUserRank(comms[c], &user_rank));
      if (user_rank != key) {
        fprintf(stderr, "rank %d: communicator %d gave rank %d, the plan needs %d\n", g_rank, c, user_rank, key);
        fail(1);
      }
    }
  }
  cudaStream_t stream;
  CUDA_CHECK(cudaStreamCreate(&stream));
  if (g_rank == 0) {
    printf("# command: %s\n", COMMAND);  // what exported it: `synth calibrate` reads the topology from it
    printf("# program: %s\n# collective %s: %d ranks, reduction groups of n = %d, type %s, %d iteration(s) after %d "
           "warm-up run(s) (-n %d -w %d)\n", PROGRAM_TEXT, GOAL_NAME, WORLD_SIZE, CHUNKS, TYPE_NAMES[type], iters,
           warmup, iters, warmup);
    printf("# reduction groups: %s\n", REDUCTION_GROUPS);
    if (shared) printf("# several ranks share a GPU: each has its own NCCL_HOSTID, so NCCL connects them over sockets\n");
  }

  long long failed = 0;
  double program_busbw = 0, baseline_busbw = 0;
  int rows = 0;
  struct result { size_t bytes, count; double program, in_place, out_of_place; long long wrong; } results[64];
  for (long long nbytes = low; nbytes <= high && rows < 64; nbytes *= factor) {
    size_t per_chunk = (size_t)((nbytes + (long long)z * CHUNKS - 1) / ((long long)z * CHUNKS));
    if (per_chunk == 0) per_chunk = 1;
    size_t count = per_chunk * CHUNKS, bytes = count * z;
    char *buf, *out, *host = (char *)malloc(bytes), *result = (char *)malloc(bytes);
    if (!host || !result) { fprintf(stderr, "rank %d: out of host memory\n", g_rank); fail(1); }
    CUDA_CHECK(cudaMalloc((void **)&buf, bytes));
    CUDA_CHECK(cudaMalloc((void **)&out, bytes));
    long long wrong = -1;
    if (check) {  // as the torch export's check: the same input through the goal's own NCCL call
      struct call flat = goal_call(per_chunk);
      fill(host, count, g_rank, type);
      if (GOAL_OP == OP_ALL_GATHER)  // the input is this rank's block, at its place; the rest is output
        for (size_t i = 0; i < count; i++)
          if (i / per_chunk != (size_t)flat.key) put(host, i, type, 0.0f);
      CUDA_CHECK(cudaMemcpy(buf, host, bytes, cudaMemcpyHostToDevice));
      CUDA_CHECK(cudaMemcpy(out, host, bytes, cudaMemcpyHostToDevice));
      issue(&flat, out, NULL, type, comms[REDUCTION_COMM], stream);
      run_program(buf, per_chunk, type, comms, stream);
      wait_stream(stream);
      CUDA_CHECK(cudaMemcpy(result, buf, bytes, cudaMemcpyDeviceToHost));
      CUDA_CHECK(cudaMemcpy(host, out, bytes, cudaMemcpyDeviceToHost));
      // What is compared: block `key` of the sum wherever the program leaves it (reduce-scatter),
      // nothing on a reduce's non-root ranks, else the whole buffer.
      size_t got = 0, want = 0, compared = count;
      if (GOAL_OP == OP_REDUCE_SCATTER) {
        got = (size_t)FINAL_PLACES[flat.key] * per_chunk;
        want = (size_t)flat.key * per_chunk;
        compared = per_chunk;
      } else if (GOAL_OP == OP_REDUCE && flat.key != 0) {
        compared = 0;
      }
      wrong = 0;
      for (size_t i = 0; i < compared; i++) wrong += get(result, got + i, type) != get(host, want + i, type);
      wrong = (long long)over_ranks((double)wrong, ncclSum, world_comm, stream);
      failed += wrong;
    }
    CUDA_CHECK(cudaMemset(buf, 0, bytes));
    struct result r = {bytes, count, 0, 0, 0, wrong};
    r.program = timed(0, buf, out, per_chunk, type, iters, warmup, comms, world_comm, stream);
    r.in_place = timed(1, buf, out, per_chunk, type, iters, warmup, comms, world_comm, stream);
    r.out_of_place = timed(2, buf, out, per_chunk, type, iters, warmup, comms, world_comm, stream);
    results[rows++] = r;
    if (g_rank == 0 && (long long)bytes != nbytes)
      printf("# %lld B is not %d chunks of whole %s elements: rounded up to %zu B\n", nbytes, CHUNKS, TYPE_NAMES[type], bytes);
    CUDA_CHECK(cudaFree(buf));
    CUDA_CHECK(cudaFree(out));
    free(host);
    free(result);
    if (nbytes > high / factor) break;
  }
  if (g_rank == 0) {
    printf("#\n# the program (in place)\n");
    print_header();
    for (int i = 0; i < rows; i++)
      program_busbw += print_row(results[i].bytes, results[i].count, type, -1, results[i].program, results[i].wrong);
    printf("# Avg bus bandwidth    : %g \n", program_busbw / rows);
    printf("#\n# baseline: one %s over each reduction group\n", OP_NCCL_NAMES[GOAL_OP]);
    print_header();
    for (int i = 0; i < rows; i++)
      baseline_busbw += print_row(results[i].bytes, results[i].count, type, results[i].out_of_place,
                                  results[i].in_place, -1);
    printf("# Avg bus bandwidth    : %g \n", baseline_busbw / rows);
    if (check) printf(failed ? "# CHECK FAILED\n" : "# check passed\n");
  }
  barrier(world_comm, stream);
  CUDA_CHECK(cudaStreamDestroy(stream));
  for (int c = 0; c < NUM_COMMS; c++)
    if (COMM_COLOR[c][g_rank] >= 0) release(comms[c]);
  release(world_comm);
  g_num_comms = 0;
  return failed ? 1 : 0;
}
