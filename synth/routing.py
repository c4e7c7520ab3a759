"""A mixture-of-experts routing as a value: what the `dispatch` and `combine` goals move
(docs/model.md section 7, "Dispatch and combine").

A routing says how many tokens each member of the expert-parallel group owns, how many
experts each token goes to (top-k), how many experts there are (spread evenly over the
members, member m hosting experts m*E/N .. (m+1)*E/N - 1), at most how many nodes a token may
reach (DeepSeek-V3 routes each token to at most 4), the capacity factor (an expert takes at
most that multiple of its mean load: it caps the hottest member's traffic), the bytes of one
token's activation, and how the router favours experts: uniformly, by a Zipf law (expert e
has weight 1/(e+1)^s, so the first experts, on the first members, are the hottest: the worst
placement), or by a given weight per expert (a measured histogram).

Tokens are drawn as a router draws them: each token takes k distinct experts, with
probability in proportion to their weights (successive sampling without replacement, done
as the Gumbel top-k); under a node limit it first keeps the M nodes with its best expert,
then its k best experts inside them (DeepSeek-V3's group-limited routing, with a node's
score its best expert's rather than the sum of its best two).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from synth.errors import UsageError
from synth.names import echo


class RoutingError(UsageError):
    """A routing that cannot be: a count that is not positive, top-k above the experts,
    experts that do not spread evenly over the members, a skew that is not a distribution."""


ELEMENT_BYTES = 2  # bf16 activations, what DeepEP and Megatron dispatch by default


@dataclass(frozen=True)
class Routing:
    """One MoE layer's routing over an expert-parallel group (module docstring)."""

    tokens: int  # tokens each member owns before dispatch
    topk: int
    experts: int  # experts in the whole group
    hidden: int = 7168  # activation width (DeepSeek-V3's)
    element_bytes: int = ELEMENT_BYTES
    node_limit: int | None = None  # at most this many nodes per token
    capacity: float | None = None  # capacity factor: an expert takes at most this multiple of its mean load
    zipf: float | None = None  # Zipf exponent of the experts' popularity
    weights: tuple[float, ...] | None = None  # a given weight per expert (a measured histogram)

    def __post_init__(self):
        for name in ("tokens", "topk", "experts", "hidden", "element_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise RoutingError(f"routing {name}={value!r}: give a positive whole number")
        if self.topk > self.experts:
            raise RoutingError(f"routing topk={self.topk} is above experts={self.experts}: a token takes distinct experts")
        if self.node_limit is not None and (not isinstance(self.node_limit, int) or self.node_limit < 1):
            raise RoutingError(f"routing node-limit={self.node_limit!r}: give a positive whole number")
        if self.capacity is not None and not (math.isfinite(self.capacity) and self.capacity >= 1):
            raise RoutingError(f"routing capacity={self.capacity!r}: give a factor of at least 1")
        if self.zipf is not None and not (math.isfinite(self.zipf) and self.zipf > 0):
            raise RoutingError(f"routing zipf={self.zipf!r}: give a positive exponent")
        if self.zipf is not None and self.weights is not None:
            raise RoutingError("routing gives both zipf and weights: give one skew")
        if self.weights is not None:
            if len(self.weights) != self.experts:
                raise RoutingError(f"routing weights has {len(self.weights)} values for {self.experts} experts: give one per expert")
            if any(not (math.isfinite(w) and w >= 0) for w in self.weights) or sum(self.weights) <= 0:
                raise RoutingError("routing weights must be non-negative numbers, not all zero")
            if sum(1 for w in self.weights if w > 0) < self.topk:
                raise RoutingError(f"routing weights leave fewer than topk={self.topk} experts with a chance")

    @property
    def bytes_per_token(self) -> int:
        return self.hidden * self.element_bytes

    @property
    def buffer_bytes(self) -> int:
        """Bytes of one member's tokens: the size its dispatch starts from."""
        return self.tokens * self.bytes_per_token

    @property
    def skewed(self) -> bool:
        return self.zipf is not None or self.weights is not None

    def with_tokens(self, tokens: int) -> Routing:
        from dataclasses import replace

        return replace(self, tokens=tokens)

    def experts_per_member(self, members: int) -> int:
        """Experts each of `members` members hosts; RoutingError when they do not spread evenly."""
        if self.experts % members:
            raise RoutingError(f"routing experts={self.experts} do not spread evenly over {members} members: give a "
                               f"multiple of {members} experts, or a group whose size divides {self.experts}")
        return self.experts // members

    def probabilities(self):
        """The router's weight of each expert, normalized (a numpy array; numpy is imported
        here so that reading a routing at the command line loads nothing heavy)."""
        import numpy as np

        if self.weights is not None:
            weights = np.asarray(self.weights, dtype=float)
        elif self.zipf is not None:
            weights = 1.0 / np.arange(1, self.experts + 1, dtype=float) ** self.zipf
        else:
            weights = np.ones(self.experts)
        return weights / weights.sum()

    def sample(self, rng, count: int, nodes: int):
        """`count` tokens' experts, [token, k] sorted, drawn with the numpy Generator `rng` as
        the module docstring says; the experts sit in `nodes` equal nodes (consecutive
        experts), for the node limit. Drawn a block of tokens at a time (the same stream of
        numbers as one draw: a [token, expert] array of 2^14 tokens by 8,192 experts is a GiB)."""
        self.check_nodes(nodes)
        return self.pick([self._keys(rng, count, start) for start in range(0, count, self._block)], nodes)

    @property
    def _block(self) -> int:
        return max(1, (1 << 23) // self.experts)

    def check_nodes(self, nodes: int) -> None:
        """RoutingError when the experts do not spread over `nodes` or the node limit leaves too few."""
        if self.experts % nodes:
            raise RoutingError(f"routing experts={self.experts} do not spread evenly over {nodes} nodes")
        reachable = self.node_limit * (self.experts // nodes) if self.node_limit is not None else self.experts
        if self.node_limit is not None and self.node_limit < nodes and reachable < self.topk:
            raise RoutingError(f"routing node-limit={self.node_limit} leaves {reachable} experts for topk={self.topk}: "
                               f"raise the node limit")

    def gumbel_keys(self, rng, count: int) -> list:
        """The router's keys of `count` tokens (log weight + Gumbel noise, [token, expert] in
        blocks), the numbers `sample` draws: they depend on the experts' weights only, not on
        the node limit or the nodes, so one draw serves every node count (`pick`)."""
        return [self._keys(rng, count, start) for start in range(0, count, self._block)]

    def _keys(self, rng, count: int, start: int):
        import numpy as np

        with np.errstate(divide="ignore"):
            weights = np.log(self.probabilities())[None, :]
        return weights + rng.gumbel(size=(min(self._block, count - start), self.experts))

    def pick(self, blocks: list, nodes: int):
        """[token, k] sorted: each token's experts from its keys (`gumbel_keys`), as `sample`."""
        import numpy as np

        self.check_nodes(nodes)
        return np.concatenate([self._sample_block(keys, nodes) for keys in blocks]
                              or [np.zeros((0, self.topk), dtype=np.int64)])

    def _sample_block(self, keys, nodes: int):
        """The sorted top-k experts of each row of Gumbel keys, within its best nodes under a
        node limit (the top-k among the kept nodes' experts, gathered in expert order so that
        ties still go to the smaller expert)."""
        import numpy as np

        count = len(keys)
        if self.node_limit is not None and self.node_limit < nodes:
            per_node = self.experts // nodes
            by_node = keys.reshape(count, nodes, per_node)
            if per_node <= 8:  # each node's best expert: a few strided maxima beat a reduction over a short axis
                score = keys[:, 0::per_node].copy()
                for j in range(1, per_node):
                    np.maximum(score, keys[:, j::per_node], out=score)
            else:
                score = by_node.max(axis=2)
            kept = np.sort(largest(score, self.node_limit), axis=1)  # [token, limit] in node order
            gathered = np.take_along_axis(by_node, kept[:, :, None], axis=1).reshape(count, -1)
            columns = largest(gathered, self.topk)
            if np.isfinite(np.take_along_axis(gathered, columns, axis=1)).all():
                experts = kept[np.arange(count)[:, None], columns // per_node] * per_node + columns % per_node
                return np.sort(experts, axis=1)
            # a token short of experts with a chance in its kept nodes: its ties at -inf go to the
            # smallest experts of all, as the whole masked row has them
            allowed = np.zeros((count, nodes), dtype=bool)
            np.put_along_axis(allowed, kept, True, axis=1)
            keys = np.where(np.repeat(allowed, per_node, axis=1), keys, -np.inf)
        return np.sort(largest(keys, self.topk), axis=1)


def largest(values, k: int):
    """[row, k] the columns of each row's k largest values, ties to the smaller column: the
    first k of a stable argsort of -values (as a set), found by a partition, not a sort of
    the whole row; rows with a tie at the k-th value are sorted whole."""
    import numpy as np

    if k >= values.shape[1]:
        return np.argsort(-values, axis=1, kind="stable")[:, :k]
    found = np.argpartition(-values, k - 1, axis=1)[:, :k]
    kth = np.take_along_axis(values, found, axis=1).min(axis=1)
    tied = np.flatnonzero((values >= kth[:, None]).sum(axis=1) > k)
    if len(tied):
        found[tied] = np.argsort(-values[tied], axis=1, kind="stable")[:, :k]
    return found


FIELDS = {"tokens": "tokens", "topk": "topk", "experts": "experts", "hidden": "hidden", "bytes": "element_bytes",
          "node-limit": "node_limit", "capacity": "capacity", "zipf": "zipf", "weights": "weights"}
EXAMPLE = "tokens=4096,topk=8,experts=256,node-limit=4,hidden=7168"


def read_histogram(path: str) -> tuple[float, ...]:
    """A measured histogram of expert loads from a text file: one number per expert (tokens
    routed to it, in expert order), separated by whitespace or commas, `#` starting a comment."""
    try:
        with open(path) as handle:
            text = handle.read()
    except OSError as error:
        raise RoutingError(f"routing weights=@{path}: cannot read it ({error.strerror or error}): give a text "
                           f"file of one load per expert") from None
    fields = [field for line in text.splitlines() for field in line.split("#", 1)[0].replace(",", " ").split()]
    values = []
    for field in fields:
        try:
            values.append(float(field))
        except ValueError:
            raise RoutingError(f"routing weights=@{path}: {echo(field)} is not a number: give one load per "
                               f"expert") from None
    if not values:
        raise RoutingError(f"routing weights=@{path} holds no numbers: give one load per expert")
    return tuple(values)


def parse_routing(text: str) -> Routing:
    """`tokens=4096,topk=8,experts=256[,node-limit=4][,hidden=7168][,bytes=2][,capacity=1.25]
    [,zipf=1.1 | ,weights=w0/w1/... | ,weights=@FILE]` into a Routing; RoutingError naming the
    bad part (a FILE is a measured histogram, `read_histogram`)."""
    values: dict[str, object] = {}
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        key, sep, raw = part.partition("=")
        key = key.strip().lower().replace("_", "-")
        if not sep or key not in FIELDS:
            raise RoutingError(f"routing part {echo(part)}: write name=value with a name of {', '.join(FIELDS)} "
                               f"(for example {EXAMPLE})")
        name = FIELDS[key]
        if name == "weights" and raw.strip().startswith("@"):
            values[name] = read_histogram(raw.strip()[1:])
            continue
        try:
            if name == "weights":
                values[name] = tuple(float(w) for w in raw.split("/"))
            elif name in ("capacity", "zipf"):
                values[name] = float(raw)
            else:
                values[name] = int(raw)
        except ValueError:
            raise RoutingError(f"routing part {echo(part)}: {echo(raw)} is not a number") from None
    missing = [key for key in ("tokens", "topk", "experts") if key not in values]
    if missing:
        raise RoutingError(f"routing {echo(text)} lacks {', '.join(missing)} (for example {EXAMPLE})")
    return Routing(**values)
