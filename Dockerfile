# Ferry's gateway and batcher image: `ferry gateway` (the default) or `ferry batcher`.
# Triton runs from NVIDIA's own tritonserver image (see deploy/helm/ferry).
# Python matches the lock file's (tests/unit/test_dockerfile.py checks it).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/ferry
WORKDIR /src
COPY requirements.lock pyproject.toml README.md ./
COPY services ./services
# Ferry and its runtime dependencies only, at the versions of the lock (all binary wheels: no
# compiler is needed here, and none reaches the final stage).
RUN /opt/ferry/bin/pip install --constraint requirements.lock . \
    && /opt/ferry/bin/ferry --version

FROM ${PYTHON_IMAGE}
RUN useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin ferry
COPY --from=build /opt/ferry /opt/ferry
ENV PATH=/opt/ferry/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    FERRY_HOST=0.0.0.0 \
    FERRY_METRICS_HOST=0.0.0.0
USER 10001:10001
EXPOSE 8000 9400
ENTRYPOINT ["ferry"]
CMD ["gateway"]
