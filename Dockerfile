# The servediag image: the live simulator (`servediag simulate NAME --serve`) and the
# diagnosis webhook (`servediag webhook`) of docker-compose.yml. Any servediag command runs:
#   docker build -t servediag .  &&  docker run --rm servediag catalog list
FROM python:3.12.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# What the wheel is built from (pyproject.toml): the package, the catalog and the scenarios
# (the lab, with the real-vLLM incident files, is not in the wheel).
WORKDIR /src
COPY pyproject.toml README.md CHANGELOG.md ./
COPY diagnoser ./diagnoser
COPY playbooks ./playbooks
COPY fixtures/scenarios ./fixtures/scenarios
RUN pip install . && rm -rf /src

RUN useradd --system --uid 10001 --no-create-home servediag
USER servediag
WORKDIR /tmp

# 8000: the simulator's /metrics; 9095: the webhook's /alerts, /healthz and /metrics.
EXPOSE 8000 9095
ENTRYPOINT ["servediag"]
CMD ["--help"]
