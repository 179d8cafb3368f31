"""The HTTP edge: uvicorn with the limits a server facing untrusted clients needs (``http_protocol``,
``edge_limits``), what it offers the hot path beyond ASGI (``request_edge``), the ASGI application
and its dispatch (``app``), admin and observability routes (``admin``), the errors every answer is
rendered from (``errors``) and running it all (``server``).
"""
