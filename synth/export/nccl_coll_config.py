"""The fix for stock NCCL as per-call `ncclCollConfig_t` values (NCCL 2.31+): a C function that,
for a call's collective, size and communicator, fills the config a program passes to
`ncclAllReduceConfig` and the other `nccl*Config` calls with the algorithm the model finds
fastest where NCCL's own pick differs (the same overrides as the tuner file, nccl_tuner.py).

Fields written, as nccl.h declares them (ncclCollConfig_t, release notes 2.31.2 "per-collective
algorithm selection, CTA/CGA size and CTA policy overrides"): `algSelection` (a selection
string in NCCL_ALGO's spelling), `forceAlgSelection` (1: an unsatisfiable selection is an error)
and `maxCTAs` (an upper bound on the call's channels: the most the pair runs on in the range,
NCCL's own rule lowering it for small calls). The struct has no protocol field: where the
model's protocol differs from NCCL's pick, the comment says so and NCCL_PROTO or the tuner file
sets it; a row whose algorithm is NCCL's own is left out (nothing here to change)."""

from __future__ import annotations

from synth.export.nccl_tuner import Override

SELECTION = {"tree": "tree", "ring": "ring", "nvls": "nvls", "nvls_tree": "nvlstree", "pat": "pat"}  # NCCL_ALGO names


def render_c(rows: tuple[Override, ...], title: str) -> str:
    """A C header: `synthCollConfig(collective, bytes, nNodes, nRanks, config)` fills a config
    made with NCCL_COLLCONFIG_INITIALIZER and returns 1 where an override applies, else 0."""
    lines = ["/*"] + [f" * {line}" for line in title.splitlines()]
    lines += [" * Needs NCCL 2.31 or later (ncclCollConfig_t). `collective` as the tuner file spells it",
              " * (allreduce, allgather, reducescatter, broadcast, reduce); `bytes` as nccl-tests' size.",
              " */", "#include <stddef.h>", "#include <string.h>", "#include <nccl.h>", "",
              "static inline int synthCollConfig(const char* collective, size_t bytes, int nNodes, int nRanks,",
              "                                  ncclCollConfig_t* config) {"]
    for row in rows:
        if row.algorithm == row.nccl_algorithm:
            lines.append(f"  /* {row.collective} {row.min_bytes}-{row.max_bytes} B, {row.nodes} node(s), {row.ranks} "
                         f"ranks: only the protocol differs ({row.protocol}, NCCL {row.nccl_protocol}); "
                         f"no ncclCollConfig_t field selects it */")
            continue
        note = "" if row.protocol == row.nccl_protocol else \
            f"; protocol {row.protocol} (NCCL {row.nccl_protocol}) needs NCCL_PROTO or the tuner file"
        lines += [f"  /* {row.collective} {row.min_bytes}-{row.max_bytes} B: NCCL picks "
                  f"{row.nccl_algorithm}/{row.nccl_protocol}, the model {row.algorithm}/{row.protocol}{note} */",
                  f"  if (strcmp(collective, \"{row.collective.lower()}\") == 0 && bytes >= {row.min_bytes}u && "
                  f"bytes <= {row.max_bytes}u && nNodes == {row.nodes} && nRanks == {row.ranks}) {{",
                  f"    config->algSelection = \"{SELECTION[row.algorithm]}\";",
                  "    config->forceAlgSelection = 1;",
                  f"    config->maxCTAs = {row.channels};",
                  "    return 1;", "  }"]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)
