"""Reading a scheduled kernel's loop nest: which output rows each thread writes; a space's candidates."""

from __future__ import annotations


def _blocks(func) -> tuple[list, list]:
    """(loops around each block realize, that realize) in program order, and every buffer a
    block allocates."""
    from tvm import tirx
    from tvm.s_tir.stmt import SBlockRealize

    allocated, found = [], []

    def walk(stmt, loops):
        if isinstance(stmt, tirx.For):
            walk(stmt.body, loops + [stmt])
        elif isinstance(stmt, tirx.SeqStmt):
            for s in stmt.seq:
                walk(s, loops)
        elif isinstance(stmt, SBlockRealize):
            allocated.extend(stmt.block.alloc_buffers)
            found.append((loops, stmt))
            walk(stmt.block.body, loops)
        elif isinstance(stmt, (tirx.LetStmt, tirx.AttrStmt, tirx.DeclBuffer)):
            walk(stmt.body, loops)
        elif isinstance(stmt, tirx.IfThenElse):
            walk(stmt.then_case, loops)

    walk(func.body, [])
    return found, allocated


def _output_writer(func):
    """(the loops around, the realize of) the block that writes the function's output: a
    buffer no block allocates."""
    found, allocated = _blocks(func)
    return [
        (loops, r)
        for loops, r in found
        if r.block.writes and not any(r.block.writes[0].source.same_as(b) for b in allocated)
    ][-1]


def parallel_loops(mod) -> int:
    """How many parallel loops the scheduled kernel has (each one a fork and a join of the threads)."""
    from tvm import tirx

    found, _ = _blocks(mod["main"])
    return len({id(loop) for loops, _ in found for loop in loops if loop.kind == tirx.ForKind.PARALLEL})


def output_shape(mod) -> list[int]:
    """The shape of the scheduled kernel's output."""
    _, realize = _output_writer(mod["main"])
    return [int(d) for d in realize.block.writes[0].source.shape]


def rows_by_thread(mod, threads: int = 2, row_axis: int = 2) -> list[tuple[int, int]]:
    """The (first, last) output row each of `threads` threads writes in a scheduled kernel:
    the block that writes the function's output (a buffer no block allocates), its row index
    (`row_axis` of NCHW / NCHW[x]c) at every point of the loops it depends on where the
    block's predicate holds (a ragged tile's last pixels do not exist), the parallel loop split
    as TVM's CPU codegen splits it: statically, in `threads` contiguous parts."""
    import itertools

    from tvm import tirx
    from tvm.sym.analyzer import Analyzer
    from tvm.tirx.analysis import undefined_vars

    loops, realize = _output_writer(mod["main"])
    (par,) = [loop for loop in loops if loop.kind == tirx.ForKind.PARALLEL]
    step = -(-int(par.extent) // threads)
    block = realize.block
    row = block.writes[0].region[row_axis].min
    needed = [realize.predicate] + [
        value
        for iv, value in zip(block.iter_vars, realize.iter_values)
        if any(iv.var.same_as(v) for v in undefined_vars(row))
    ]
    free = [v for e in needed for v in undefined_vars(e)]
    varying = [loop for loop in loops if any(loop.loop_var.same_as(v) for v in free)]
    bounds: list[list[int]] = [[] for _ in range(threads)]
    for point in itertools.product(*(range(int(loop.min), int(loop.min) + int(loop.extent)) for loop in varying)):
        analyzer = Analyzer()
        for loop, value in zip(varying, point):
            analyzer.bind(loop.loop_var, value)
        for iv, value in zip(block.iter_vars, realize.iter_values):
            analyzer.bind(iv.var, value)
        if not bool(analyzer.simplify(realize.predicate)):
            continue
        thread = dict((id(loop), v) for loop, v in zip(varying, point)).get(id(par), 0) // step
        bounds[thread].append(int(analyzer.simplify(row)))
    return [(min(b), max(b)) if b else (-1, -1) for b in bounds]


def candidates(mod, target, space_generator, seed: int = 0) -> list:
    """Every design space of a task, its knobs sampled and the postprocessors applied, as a
    candidate is built (a generator's postprocessors must all accept each space)."""
    from tvm.s_tir import Schedule
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(
        mod=mod, target=target, space_generator=space_generator, task_name="candidates", rand_state=seed
    )
    out = []
    for space in ctx.generate_design_space():
        sch = Schedule(mod)
        space.trace.apply_to_schedule(sch, remove_postproc=True)
        sch.enter_postproc()
        assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
        out.append(sch)
    return out
