# The commitline image: one image for every process (publish, project, sagas run, migrate, status).
# docker-compose.yml builds it and picks the subcommand with `command:`.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# README.md is part of the package metadata (pyproject's `readme`), so the build needs it.
COPY pyproject.toml README.md ./
COPY commitline ./commitline
RUN pip install . \
    && useradd --create-home --uid 10001 --user-group commitline

# Never run as root. A configured COMMITLINE_DATABASE_URL is expected; without one the embedded
# PostgreSQL would keep its data in the (writable) home folder, which is for trying things only.
USER commitline
WORKDIR /home/commitline

ENTRYPOINT ["commitline"]
CMD ["--help"]
