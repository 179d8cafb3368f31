"""Benchmark: what one huge prompt being counted adds to the latency of small requests beside it.

Three kinds of process: simulated replicas (``kvgate sim``, real time), one gateway per checkout
(``kvgate serve`` on uvloop, configured as ``kvgate up`` configures it: admission on, kvgate routing,
a text access log), and this driver. Eight closed-loop clients send short chats (``max_tokens`` 2)
while two phases alternate: quiet (the small clients alone) and huge (a 1 MB chat prompt every
0.5 s beside them). In ``--variant over`` the huge prompt is over the model's 128k-token context,
so it ends in a 400; in ``--variant fits`` the model's window is made large enough and the pool's
KV capacity too small for it, so it is counted in full and then refused by admission.

``--checkout DIR`` (repeatable) runs a gateway from each source tree, all of them at once in front of
the same replicas, and drives them in turn, round after round (A quiet, A huge, B quiet, B huge,
then A huge, A quiet, ...: the order flips each round so a drift favours no phase), so an old and a
new gateway are compared in one run on one machine; e.g. with ``git archive main | tar -x -C
/tmp/old``. Prints each phase as it ends, then small-request p50/p99 per checkout and phase and the
p99 the huge prompts add. ``--up`` runs ``kvgate up`` instead (the replicas in the gateway's own
process and event loop), as someone trying kvgate would. ``--py-spy FILE`` records the first
gateway with py-spy (raw stacks of the threads holding the GIL), to find where the time goes.

``--shape`` picks the huge prompt's shapes (``bench.neighbours.prompts``: prose ``words``, random
``short-words``, one unbroken run of ``letters``; comma-separated, or ``all``), each run in turn.

    python -m bench neighbours [--rounds 4] [--phase-s 5] [--variant over|fits|both]
        [--shape words|short-words|letters|all] [--checkout DIR ...] [--up] [--py-spy FILE]
    python -m bench neighbours --loop-lag [--checkout DIR ...] [--rounds 4] [--prompts 10] [--shape ...]
"""
