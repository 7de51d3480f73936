"""Bench-only shim for measuring an operator of an earlier commit that has no
``agentrun_kube_requests_total`` (``BENCH_OPERATOR_PYTHONPATH`` in bench_operator_cluster.py puts
this directory first on its PYTHONPATH): it counts every request of the ``kubernetes`` client,
labelled like the operator's own counter, on the operator's metrics registry. Requests of Kopf's
own aiohttp watches are not counted by it (a few per minute). Does nothing for an operator that
counts its requests itself."""

from __future__ import annotations

try:
    import agentrun.metrics as _m

    if not hasattr(_m, "kube_request"):
        from urllib.parse import parse_qs, urlsplit

        from kubernetes.client import rest as _rest
        from prometheus_client import Counter

        _counter = Counter("agentrun_kube_requests", "kubernetes client requests (bench shim)",
                           ["verb", "resource", "code"], registry=_m.REGISTRY)

        def _labels(method: str, url: str) -> tuple[str, str]:
            parts = urlsplit(url)
            segs = [s for s in parts.path.split("/") if s]
            segs = segs[2:] if segs[:1] == ["api"] else segs[3:] if segs[:1] == ["apis"] else []
            if len(segs) >= 3 and segs[0] == "namespaces":
                segs = segs[2:]
            resource = (segs[0] if segs else "other") + (f"/{segs[2]}" if len(segs) >= 3 else "")
            if method.upper() == "GET":
                watch = parse_qs(parts.query).get("watch", [""])[0] in ("true", "1")
                return ("watch" if watch else "get" if len(segs) >= 2 else "list"), resource
            return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(
                method.upper(), method.lower()), resource

        _inner = _rest.RESTClientObject.request

        def _request(self, method, url, *args, **kwargs):  # type: ignore[no-untyped-def]
            verb, resource = _labels(method, url)
            try:
                resp = _inner(self, method, url, *args, **kwargs)
            except Exception:
                _counter.labels(verb, resource, "<error>").inc()
                raise
            _counter.labels(verb, resource, str(resp.status)).inc()
            return resp

        _rest.RESTClientObject.request = _request  # type: ignore[method-assign]
except Exception:  # noqa: BLE001 - not an operator environment
    pass
