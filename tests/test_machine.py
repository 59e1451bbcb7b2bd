"""Benchmark results name the CPU and the instruction-set flags that decide a conv's kernels."""

from vta_pipeline.boards import machine


def test_cpu_reads_the_model_and_the_isa_flags_that_matter(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 avx512f avx512bw "
        "avx512_vnni\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu\n"
    )
    cpu = machine.cpu(info)
    assert cpu["cpu"] == "AMD EPYC 9R14" and cpu["isa"] == ["avx2", "avx512f", "avx512bw", "avx512_vnni"]
    assert cpu["logical_cpus"] >= 1


def test_cpu_on_an_arm_board_lists_its_neon_and_dot_product(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nFeatures\t: fp asimd evtstrm asimddp\nCPU part\t: 0xd08\n")
    assert machine.cpu(info)["isa"] == ["asimd", "asimddp"]
