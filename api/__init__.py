"""HTTP APIs: the internal node protocol (heartbeat, callback) mirroring GitLab's,
and the operator API. Views authenticate, validate with a serializer, make one
``do_*`` call and return a small reply.
"""
