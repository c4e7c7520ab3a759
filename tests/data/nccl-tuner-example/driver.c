/* Test driver for synth's tuner-file export (not part of NCCL): loads a tuner file with the
 * example plugin's own parser and matcher (plugin.c, NVIDIA/nccl plugins/tuner/example) and, for
 * each query "collective nBytes" read from standard input, prints the algorithm and protocol
 * index whose cost the plugin set to 0 (-1 -1 when none) and the channels it answered.
 * Usage: NCCL_TUNER_CONFIG_FILE=file ./driver nRanks nNodes < queries */
#include <stdio.h>
#include <stdlib.h>
#include "tuner.h"

extern const ncclTuner_v5_t ncclTunerPlugin_v5;

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  size_t nRanks = strtoull(argv[1], NULL, 10), nNodes = strtoull(argv[2], NULL, 10);
  void* context = NULL;
  if (ncclTunerPlugin_v5.init(&context, 0, nRanks, nNodes, NULL, NULL, NULL) != ncclSuccess) return 1;
  int collective;
  size_t nBytes;
  while (scanf("%d %zu", &collective, &nBytes) == 2) {
    float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++)
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++) table[a][p] = 1.0f;
    int channels = 0, algorithm = -1, protocol = -1;
    if (ncclTunerPlugin_v5.getCollInfo(context, (ncclFunc_t)collective, nBytes, 1, (float**)table,
                                       NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS, 0, &channels) != ncclSuccess) return 1;
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; a++)
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; p++)
        if (table[a][p] == 0.0f) { algorithm = a; protocol = p; }
    printf("%d %d %d\n", algorithm, protocol, channels);
  }
  ncclTunerPlugin_v5.finalize(context);
  return 0;
}
