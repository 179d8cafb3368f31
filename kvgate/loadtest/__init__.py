"""``kvgate loadtest``: workloads in tokens (``workload``, ``workload_file``, ``distributions``,
``prompt_text``), open- and closed-loop arrivals (``arrivals``), a client timed as users feel it
(``client``, ``runner``), several targets compared in one run (``compare``) and the report with
its plots (``report``).
"""
