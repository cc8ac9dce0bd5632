"""`rljax ablate`: every step of an experiment file over seeds, paired, with verdicts
(`runner.run_ablation`), the descriptive table (`table`), the outcomes (`outcomes`), the
report (`report`) and compiled-program reuse (`compile_cache`)."""
