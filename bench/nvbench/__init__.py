"""nvbench: the nvstack benchmark harness.

Pipeline (each stage only reads what the previous one wrote):

    run    -> OUT/runs/<experiment>/<workload>/<variant>/<fs>/rep<N>/
              (cmd.txt, stdout.txt, stderr.txt, env.json, repro.sh, result.json, ...)
    parse  -> OUT/<experiment>.csv           (parse.py; never runs anything)
    plot   -> OUT/*.png + OUT/summary.md     (plot.py, summary.py; never runs anything)
"""

__version__ = "0.1.0"
