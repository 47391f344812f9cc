"""The live room: the loop every live command shares, written once.

    loop.Loop       session.intervals -> Window -> the analysis runner (every K reads; a window
                    offered while the previous analysis still runs is skipped and counted)
    loop.Reader     the same reads in a background thread (export: scrapes render the last state)
    loop.Attached   signals during an attach: SIGTERM/SIGHUP/Ctrl-C leave the block, detach, exit code
    runner          AnalysisRunner: analysis.analyze in a worker thread, one at a time, last result kept
    top             run_plain / run_tty: `top` (the screen: outputs/topview.py, toprich.py)
    export          LiveSource: `export -i` (the metrics: outputs/exporter.py; /v1: outputs/http.py)

`watch -i` (cli/watch.py) runs a Loop and turns each analysis into finding events. Outputs
never import sources: this room wires a LiveSession (sources/live.py) to them. Import the
submodules (numpy and the data plane are heavy; `skewscope --help` imports none of this).
"""
