"""The reference looped-transformer engine (random weights) and its load generator.

A real PyTorch engine, CPU or CUDA, instrumented with the rltperf probe: it is the
embedded default target of ``rltperf demo`` and the ground truth the monitor's numbers
are checked against.  ``rltperf engine --help`` runs it; in code::

    from engine_adapters.probe import Probe
    from engine_adapters.reference.engine import Engine, EngineConfig

    eng = Engine(EngineConfig(preset="tiny", exit="gate:0.8", exit_mode="compact"))
    probe = Probe("127.0.0.1:0", eng.engine_info())
    eng.attach(probe)
    eng.run(duration=10)
    probe.close()

Modules: ``presets`` (shapes), ``analytic`` (parameter, byte and FLOP counts), ``model``
(the looped transformer), ``batch`` (flat layout, attention groups, compacted views),
``kvcache`` (paged per-depth / shared KV), ``exits`` and ``spec`` (policies),
``scheduler`` (continuous batching), ``loadgen`` (workloads), ``engine`` (the step loop).
Nothing here imports torch until an engine or model is built.
"""
