"""Expert parallelism: which rank holds which experts of a mixture-of-experts model.

With `--tensor-parallel-size N --enable-expert-parallel`, rank r of N holds the contiguous
experts [r*E/N, (r+1)*E/N) (met.model.moe.owned_experts), each whole: every row of its gate and
up projections, every column of its down projection. Attention is split by heads as tensor
parallelism does, and the router is replicated. Every rank routes every token itself (the
router's input is the same on all ranks after attention's all-reduce), runs only the experts it
holds on the tokens routed to them, and the partial MoE outputs are summed by the all-reduce
tensor parallelism already runs after each MLP.

Kept free of torch: the server's settings check NEEDS_RANKS before anything loads.
"""

from __future__ import annotations

from met.model.config import ModelConfig

NEEDS_RANKS = (
    "enable_expert_parallel: needs --tensor-parallel-size N > 1 (tensor_parallel_size), the "
    "ranks the experts are split over"
)


class ExpertSplitError(ValueError):
    """Expert parallelism was asked for a model or rank count it cannot serve."""


def check_expert_split(config: ModelConfig, world: int) -> None:
    """Raise ExpertSplitError when `config`'s experts do not split over `world` ranks."""
    experts = config.n_experts
    if world < 2:
        raise ExpertSplitError(NEEDS_RANKS)
    if experts == 0:
        raise ExpertSplitError(
            f"enable_expert_parallel: this {config.architecture} model is dense, it has no "
            "experts to split; drop the flag (--tensor-parallel-size alone splits it)"
        )
    if experts % world:
        sizes = ", ".join(str(n) for n in range(2, experts + 1) if experts % n == 0)
        raise ExpertSplitError(
            f"expert parallel: cannot split {experts} experts over {world} ranks; the "
            f"tensor-parallel size must divide the expert count (this model allows {sizes})"
        )


def describe_split(config: ModelConfig, world: int, expert_parallel: bool) -> str | None:
    """One line saying how the model is split over the ranks; None for one process."""
    if world == 1:
        return None
    heads = f"attention {config.n_heads // world} of {config.n_heads} heads a rank"
    if not expert_parallel:
        mlp = "every expert's MLP width" if config.n_experts else "the MLP width"
        return f"tensor parallel over {world} ranks: {heads}, {mlp} split {world} ways"
    from met.model.moe import owned_experts

    owners = ", ".join(
        f"rank {r}: {owned.start}-{owned.stop - 1}"
        for r, owned in ((r, owned_experts(config.n_experts, r, world)) for r in range(world))
    )
    return (
        f"expert parallel over {world} ranks: {config.n_experts} experts, "
        f"{config.n_experts // world} whole experts a rank ({owners}), router replicated; "
        f"{heads} (tensor parallel)"
    )
