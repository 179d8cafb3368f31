"""The words admission and routing both speak: a replica as the decisions see it (``ReplicaView``,
its ``ReplicaLoad``, its ``Role`` in a pool), whether it has room for a request (``fits``), and the
``@frozen_value`` the per-request values are built with.

Both cores import this package and neither imports the other, so the admission decision and the
routing filter read one definition of a replica and of its room.
"""
