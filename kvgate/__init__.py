"""The ``kvgate`` command line and its composition roots (``kvgate up``): the one place that may
import both the runtime packages and the load tester."""
