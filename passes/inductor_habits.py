"""The Inductor habits the memory model mirrors, as data: one `Habit` per
code-generation rule of Inductor that adacc's prediction of a step's peak
relies on, with the code that mirrors it.

Why: the rules live where they are used (`fusion`, `memory_sim`,
`lifetimes`, `early_placement`, `compress_rewrite`, `adacc_compile.compat_inductor`,
`adacc_compile.partitioner`), each with the measurement that put it there.
Listed here, a reader can audit every mirrored rule in one place, and a new
torch release is one place to check: `unchecked_on` names the habits nobody
has checked on it yet. A habit that drifts unnoticed does not break the
budget: the measured first step (`adacc_compile.step_measure`) compares
the step's real peak with the model's and re-plans once by the difference.

Reads and writes nothing; ``tests/passes/test_inductor_habits.py`` checks
that every name in ``mirrored_in`` still resolves, so the table cannot rot
when the code is renamed.
"""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("cpp", "triton")
"""Inductor's code generators: C++ on CPU, Triton on GPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Habit:
    """One Inductor code-generation rule and where adacc mirrors it."""

    name: str
    """Short snake_case id."""
    rule: str
    """What Inductor does that the model mirrors."""
    backends: tuple[str, ...]
    """The code generators (`BACKENDS`) it was observed on."""
    mirrored_in: tuple[str, ...]
    """The functions, classes and constants that mirror it, as dotted paths
    under the package ``adacc_compile`` (``passes.fusion.materialised``)."""
    checked_on: tuple[str, ...]
    """Torch versions ("major.minor") it was checked on."""
    evidence: str
    """The measurement or file the mirroring code cites ("" for none)."""


_BOTH = BACKENDS
_CPU = ("cpp",)
_CHECKED = ("2.13",)

HABITS: tuple[Habit, ...] = (
    # -- which values are written to a buffer -------------------------------
    Habit(
        name="pointwise_fused_into_readers",
        rule="A pointwise op whose readers are all pointwise ops, reductions or indexing loads (through views) "
        "is fused into their kernels: its value is never written, neither in the forward nor recomputed in "
        "the backward.",
        backends=_BOTH,
        mirrored_in=(
            "passes.fusion.materialised", "passes.fusion.is_pointwise", "passes.fusion.absorbs_producer",
            "passes.lifetimes.candidate_lifetime",
        ),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: on a GPT-2 loss graph the unfused simulation counted 720 MB of sub/exp "
        "values that Inductor never materialises",
    ),
    Habit(
        name="scatter_into_a_slice_is_pointwise",
        rule="slice_scatter and select_scatter, though not tagged pointwise, are lowered to a pointwise select "
        "between their two inputs and fuse like any pointwise op.",
        backends=_BOTH,
        mirrored_in=("passes.fusion._POINTWISE_LOWERINGS", "passes.fusion.is_pointwise",
                     "passes.fusion.absorbs_producer"),
        checked_on=_CHECKED,
        evidence="",
    ),
    Habit(
        name="indexing_loads_inline_their_producer",
        rule="gather, index, _unsafe_index and embedding load the tensor they index through its loader, so an "
        "unwritten pointwise producer is inlined into them (a cross-entropy's log-probabilities, read by the "
        "gather of the targets, never exist).",
        backends=_BOTH,
        mirrored_in=("passes.fusion._INLINING_INDEXERS", "passes.fusion.absorbs_producer"),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: measured on an H200 and on a CPU; counting them put a 32000-word "
        "vocabulary's 500 MiB into the forward's peak",
    ),
    Habit(
        name="unfused_ops_read_buffers",
        rule="Matmuls, attention, norms, random ops, collectives, custom ops and scatters write their outputs, "
        "and a pointwise value one of them reads, directly or through a view, is written too (Inductor's mm "
        "reads a buffer).",
        backends=_BOTH,
        mirrored_in=("passes.fusion.materialised", "passes.fusion.absorbs_producer"),
        checked_on=_CHECKED,
        evidence="",
    ),
    Habit(
        name="constant_fill_is_an_index_expression",
        rule="A constant fill (full, zeros, ones, scalar_tensor) read only by fused ops is an index expression "
        "in their kernels, not a buffer.",
        backends=_BOTH,
        mirrored_in=("passes.fusion._CONSTANT_FILLS", "passes.fusion._fill_needs_no_buffer",
                     "passes.fusion.inlined_reads"),
        checked_on=_CHECKED,
        evidence="",
    ),
    Habit(
        name="functional_scatter_copies_its_first_input",
        rule="A functional scatter (index_put, scatter, scatter_add, ...) is lowered as a copy of its first "
        "input into its own output, then written in place: the copy's kernel computes that input, which gets "
        "no buffer of its own.",
        backends=_BOTH,
        mirrored_in=("passes.fusion._SCATTERS_INTO_A_COPY", "passes.fusion._computes_it_in_its_kernel",
                     "passes.fusion._fill_needs_no_buffer"),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: the embedding backward's zeros (250 MiB for a 32000 x 2048 float32 "
        "table) were counted twice before",
    ),
    Habit(
        name="inductor_random_kept_only_where_unfused",
        rule="Inductor's own random numbers (prims.inductor_random, dropout without fallback_random) are "
        "realised by their lowering, and the scheduler drops that buffer where every reader fuses with the "
        "kernel that writes them: none waits for a later matmul and each loops over as many elements.",
        backends=_BOTH,
        mirrored_in=(
            "passes.fusion._REALISED_BY_THEIR_LOWERING", "passes.fusion._kept_by_the_scheduler",
            "passes.fusion._waits_for_a_boundary_after", "passes.fusion._loop_size",
        ),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: modelled as a buffer, a GPT d_model 256 compress-only step was predicted "
        "4.3 MiB over the allocator's peak; a backward recomputing the dropout mask after the recomputed "
        "scores' matmul writes them (4 MiB, measured)",
    ),
    Habit(
        name="fallback_copies_an_unwritten_input",
        rule="A fallback that constrains its input to the FX graph's strides (native_dropout under "
        "fallback_random) gets its own copy of an unwritten pointwise input, written right before it; the "
        "value's other readers still inline it.",
        backends=_BOTH,
        mirrored_in=("passes.fusion._INPUT_COPYING_FALLBACKS", "passes.fusion.copies_its_input",
                     "passes.memory_sim._input_copies"),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: the 4 MiB a GPT d_model 256 step held above the model in the second "
        "block's dropout (measured)",
    ),
    Habit(
        name="realised_when_inlining_reads_too_much",
        rule="The lowering writes a fusible value anyway when it has several readers and its inlined "
        "computation reads more than realize_reads_threshold buffers, or reads more than the accumulated-reads "
        "threshold with any number of readers (thresholds read from Inductor's config).",
        backends=_BOTH,
        mirrored_in=("passes.fusion.realised_by_lowering", "passes.fusion.inlined_reads",
                     "compat_inductor.realize_thresholds", "compat_inductor.RealizeThresholds"),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: a LayerNorm backward's input gradient reads seven buffers inlined and is "
        "written; the 1 MiB a 2-layer GPT's step held above the model before the rule (measured)",
    ),
    Habit(
        name="realised_on_cpu_when_holding_a_heavy_op",
        rule="On CPU the lowering also writes a fusible value with several readers whose inlined computation "
        "holds an exponential, logarithm, sigmoid or tanh (not erf).",
        backends=_CPU,
        mirrored_in=("compat_inductor.realize_thresholds", "passes.fusion.realised_by_lowering"),
        checked_on=_CHECKED,
        evidence="",
    ),
    Habit(
        name="realised_buffer_dropped_where_readers_fuse",
        rule="The scheduler drops a realised buffer whose readers all fuse into the kernel that writes it; it "
        "stays only where a reader (or the kernel a reader is inlined into) runs past a matmul or another op "
        "that cannot share the kernel.",
        backends=_BOTH,
        mirrored_in=("passes.fusion._read_past_a_kernel_boundary", "passes.fusion._reading_kernels"),
        checked_on=_CHECKED,
        evidence="",
    ),
    Habit(
        name="value_a_codec_reads_is_written_once",
        rule="An unwritten pointwise value is recomputed in every kernel loop that reads it, so a value a codec "
        "compresses first passes through prims.inductor_force_stride_order, which Inductor writes once to a "
        "buffer every reader loads; the model counts that buffer.",
        backends=_BOTH,
        mirrored_in=(
            "compat_inductor.realize_op", "passes.compress_rewrite._written_once", "passes.op_class.is_realize_op",
            "passes.lifetimes._written_bytes", "passes.plan_problem.Lifetime.written_bytes",
        ),
        checked_on=_CHECKED,
        evidence="passes/compress_rewrite.py: a GPT forward kernel ran a GELU's erf in three loops (the "
        "codec's statistics, its codes and the store the next matmul reads), measured",
    ),
    Habit(
        name="fused_codec_needs_no_scratch",
        rule="A codec's compress, spliced in as aten ops, fuses into kernels that hold little beyond the value "
        "and its payload, so under Inductor no compress scratch is counted (eager runs it op by op).",
        backends=_BOTH,
        mirrored_in=("passes.codec_options.make_compress_options",
                     "passes.plan_problem.CompressOption.compress_scratch"),
        checked_on=_CHECKED,
        evidence="",
    ),
    # -- where a fused value's reads happen ---------------------------------
    Habit(
        name="fused_value_read_where_its_reader_runs",
        rule="A value fused into the one op that reads it is computed in that op's kernel, so what it reads "
        "stays allocated until that kernel runs.",
        backends=_BOTH,
        mirrored_in=("passes.memory_sim._kernel_positions",),
        checked_on=_CHECKED,
        evidence="",
    ),
    Habit(
        name="fused_value_recomputed_in_each_reader",
        rule="A fused value with several readers is computed again in each reader's kernel; a reader that waits "
        "for a matmul run after the value cannot join an earlier kernel, so the value's inputs stay allocated "
        "until the last such reader runs.",
        backends=_BOTH,
        mirrored_in=("passes.memory_sim._kernel_positions", "passes.memory_sim._last_kernel_boundary",
                     "passes.memory_sim._readers_through_views"),
        checked_on=_CHECKED,
        evidence="passes/memory_sim.py: a Llama block's residual sum recomputed in the RMSNorm backward kept the "
        "attention projection's output allocated; the 1 MiB a 2-layer Llama's step held above the model "
        "before (measured)",
    ),
    # -- when buffers are allocated and freed -------------------------------
    Habit(
        name="cpu_kernel_group_allocates_and_frees_together",
        rule="On CPU the generated kernels between two external calls form one C++ function: every output of "
        "the group is allocated before it runs and what the group read last is freed when it returns; an "
        "external call frees its dead inputs right after it runs.",
        backends=_CPU,
        mirrored_in=("passes.fusion.kernel_group_ends", "passes.fusion.runs_as_extern_kernel",
                     "passes.memory_sim._run_graph"),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: a GPT forward's GELU and its derivative (4 MiB each) and their codes were "
        "alive at once (measured), where freeing each after its compress put the step 2.5 MiB under the "
        "allocator's peak; a Llama's compress-only plans were 0.15 MiB under it, now exact",
    ),
    Habit(
        name="extern_outputs_freed_at_their_getitem",
        rule="The wrapper takes the outputs it needs from an external call and frees the call's other outputs "
        "at once (del right after native_dropout under fallback_random), not when the next kernel group "
        "returns.",
        backends=_CPU,
        mirrored_in=("passes.fusion._takes_an_extern_output", "passes.fusion.kernel_group_ends"),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: freeing the unused dropout output when the next group returned put a GPT's "
        "forward 1 MiB over the allocator's trace at the attention",
    ),
    Habit(
        name="bitcast_to_another_width_is_a_fallback",
        rule="A view(dtype) to a dtype of another width (a codec's int8 bytes read as int32) runs as a "
        "fallback call (to_dtype_bitcast), which ends a C++ kernel group.",
        backends=_CPU,
        mirrored_in=("passes.fusion._bitcast_to_another_width", "passes.fusion.runs_as_extern_kernel"),
        checked_on=_CHECKED,
        evidence="",
    ),
    Habit(
        name="pointwise_kernel_writes_into_a_dying_input",
        rule="A pointwise kernel with one contiguous output writes it into an input storage of the same size "
        "and dtype that it reads element for element and that dies with it, or earlier in its CPU kernel "
        "group (decide_inplace_update); of the backward's inputs, only saved values the forward computed "
        "(AOTAutograd donates those).",
        backends=_BOTH,
        mirrored_in=("passes.memory_sim._inplace_donor", "passes.memory_sim._read_in_order",
                     "passes.memory_sim._ORDER_KEEPING_VIEWS", "passes.memory_sim._Storage"),
        checked_on=_CHECKED,
        evidence="passes/memory_sim.py: on an H200 the cross-entropy backward writes the logits' gradient into "
        "the logits (250 MiB for a 32000-word vocabulary and 4096 tokens); counted as a second buffer, the "
        "@0.8 plans were over-predicted by 16%",
    ),
    Habit(
        name="cpu_dropout_fallback_temporary",
        rule="Under fallback_random native_dropout runs as ATen's op, which on CPU multiplies its input by the "
        "mask converted to the input's dtype: an input-sized temporary while it runs (CUDA's fused kernel has "
        "none).",
        backends=_CPU,
        mirrored_in=("passes.memory_sim._eager_dropout_workspace", "passes.memory_sim._workspaces"),
        checked_on=_CHECKED,
        evidence="passes/memory_sim.py (profiler allocator trace, 2026-12-05): a 2-layer GPT (d_model 256) "
        "peaked inside the attention dropout, this 4 MiB temporary one of what the simulation missed",
    ),
    # -- where the forward computes what only the backward reads ------------
    Habit(
        name="backward_only_value_computed_in_first_reading_kernel",
        rule="A value only the backward reads that the forward computes (a norm's normalised input, a SwiGLU's "
        "backward factors) is fused into the first forward kernel, after its inputs exist, that reads one of "
        "its inputs, not computed at the forward's end where the joint graph puts it.",
        backends=_BOTH,
        mirrored_in=(
            "passes.early_placement.place_backward_only_values_early", "passes.early_placement._reading_kernel",
            "stages.classify", "config.AdaccConfig.place_backward_only_early",
        ),
        checked_on=_CHECKED,
        evidence="bench/RESULTS.md: a Llama compress-only plan @0.4 measured 28.09 MiB for a predicted 24.90, "
        "now 24.97 for 24.98; a 3-layer GPT d256 mixed plan @0.4 measured 40.56 MiB for a predicted 38.55, "
        "now 37.82 for 39.56",
    ),
    Habit(
        name="peak_memory_reorder_runs_compress_early",
        rule="Inductor's reorder_for_peak_memory runs a kernel earlier where that frees its input, so the "
        "compress chain of a view only the backward reads runs right after its producer, not in the forward's "
        "last C++ kernel group; the model takes such views early (the reorder's other moves only lower the "
        "real peak and are not mirrored).",
        backends=_CPU,
        mirrored_in=("passes.early_placement.place_backward_only_values_early", "stages.classify",
                     "config.AdaccConfig.place_backward_only_views_early"),
        checked_on=_CHECKED,
        evidence="bench/RESULTS.md: a GPT d256 compress-only plan @0.4 was predicted at 48.14 MiB for a "
        "measured 32.66; with its views placed early, 32.67 for 32.66",
    ),
    # -- what the model's costs assume --------------------------------------
    Habit(
        name="fused_recomputation_costs_its_reads",
        rule="A recomputed value fused into its readers costs them only the reads of its inputs, not a kernel "
        "of its own; keeping a fused value costs writing it in the forward and reading it back.",
        backends=_BOTH,
        mirrored_in=("passes.fusion.recompute_seconds", "passes.fusion.keep_seconds"),
        checked_on=_CHECKED,
        evidence="passes/fusion.py: charging every recomputed op a full kernel, adacc once held 1.30x the "
        "default's memory on a Llama at budget 0.7",
    ),
    Habit(
        name="activation_backwards_decomposed",
        rule="Inductor's table decomposes activation backwards and has no lowering for one kept whole: adacc "
        "keeps whole only those a planned few-bit codec replaces and the model was checked on whole "
        "(gelu_backward, not silu_backward), and decomposes what the plan leaves of them before lowering.",
        backends=_BOTH,
        mirrored_in=("partitioner.MODELLED_WHOLE_OPS", "partitioner.whole_ops", "compat_inductor.decompose_whole_ops",
                     "compat_inductor.inductor_compile"),
        checked_on=_CHECKED,
        evidence="bench/RESULTS.md: silu_backward kept whole, a 2-layer Llama's compress-only plan at 0.4 "
        "(d_model 256) measured 23.72 MiB against 23.06 predicted (25.97 / 25.97 with the op decomposed)",
    ),
    # -- habits adacc turns off for its own graphs --------------------------
    Habit(
        name="buffer_reuse",
        rule="Inductor hands a freed buffer to a later allocation of the same size (allow_buffer_reuse), which "
        "keeps it allocated from its last use until then; adacc turns this off for its graphs (option "
        "inductor_buffer_reuse), so a value is freed after its last reader, as the model frees it.",
        backends=_BOTH,
        mirrored_in=("partitioner.AdaccPartitioner.plan_and_compile", "config.AdaccConfig.inductor_buffer_reuse"),
        checked_on=_CHECKED,
        evidence="bench/RESULTS.md: a 2-layer Llama (d_model 256) recompute-only plan peaked at 32.2 MiB with "
        "reuse and 26.8 MiB without",
    ),
    Habit(
        name="far_fusion_of_placed_nodes",
        rule="Inductor fuses kernels that share an input even when far apart in the graph, which runs a "
        "recomputation or a decompression, with its buffers, somewhere else; adacc turns this off for the "
        "nodes the plan placed, which fuse only with their neighbours.",
        backends=_BOTH,
        mirrored_in=("compat_inductor._PinnedNodesStay", "compat_inductor.inductor_compile", "passes.fusion.mark_placed",
                     "passes.fusion.PLACED"),
        checked_on=_CHECKED,
        evidence="bench/RESULTS.md: on a 2-layer Llama Inductor ran layer 0's recomputed RoPE with layer 1's; "
        "with the guard the measured step peak of that recompute-only plan fell from 26.8 to 24.8 MiB",
    ),
)


def _major_minor(version: str) -> str:
    """"2.13.0+cpu" -> "2.13"."""
    return ".".join(version.split("+", 1)[0].split(".")[:2])


def unchecked_on(version: str) -> tuple[Habit, ...]:
    """The habits nobody has checked on torch ``version`` (any form of it:
    ``torch.__version__`` will do): what to check first after an upgrade."""
    wanted = _major_minor(version)
    return tuple(h for h in HABITS if wanted not in h.checked_on)


def habits_for(backend: str) -> tuple[Habit, ...]:
    """The habits observed on Inductor's ``backend`` code generator ("cpp"
    or "triton")."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown Inductor backend {backend!r}; expected one of {BACKENDS}")
    return tuple(h for h in HABITS if backend in h.backends)
