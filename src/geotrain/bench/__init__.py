"""Benchmarks as functions that return data (the CLI prints tables and --json from it)."""

from geotrain.bench.codecs import CodecBench, CodecBenchConfig, CodecVariant, run_codec_bench
from geotrain.bench.ddp import DDPBench, DDPBenchConfig, DDPRun, DDPRunResult, run_ddp, run_ddp_bench
from geotrain.bench.plan import BenchRun, PlanBench, PlanBenchConfig, default_runs, method_rows, run_plan_bench, swap_speed

__all__ = ["CodecBench", "CodecBenchConfig", "CodecVariant", "run_codec_bench",
           "DDPBench", "DDPBenchConfig", "DDPRun", "DDPRunResult", "run_ddp", "run_ddp_bench",
           "BenchRun", "PlanBench", "PlanBenchConfig", "default_runs", "method_rows", "run_plan_bench", "swap_speed"]
