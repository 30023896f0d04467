# The gateway as a container: the wheel on a slim Python, run by an unprivileged user.
#   docker build -t conversation-gateway .
#   docker run -p 8000:8000 -e GATEWAY_API_KEYS=... -e GATEWAY_TOKEN_SECRET=... conversation-gateway
# Bound to 0.0.0.0 the gateway requires API keys (it refuses to start without them); see
# docs/deploy.md for the settings to pass (every one is a GATEWAY_* variable).

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gateway gateway
COPY client_sdk client_sdk
COPY web_demo web_demo
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GATEWAY_PORT=8000
COPY --from=build /dist /dist
RUN pip install --no-cache-dir /dist/*.whl \
    && rm -rf /dist \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin gateway
USER gateway
WORKDIR /tmp
EXPOSE 8000
# Liveness only (/readyz is for the load balancer). The slim image has no curl: Python does it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request; url = 'http://127.0.0.1:%s/healthz' % os.environ.get('GATEWAY_PORT', '8000'); sys.exit(0 if urllib.request.urlopen(url, timeout=4).status == 200 else 1)"]
CMD ["gateway", "serve", "--host", "0.0.0.0"]
