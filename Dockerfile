# One image for every role (web, worker, beat, migrate); the command picks the role.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# The whole build context, as .dockerignore leaves it: every app is copied without a list.
# The dependencies come from requirements.lock, each checked against its hash; the project
# itself adds none.
COPY . .
RUN pip install --require-hashes -r requirements.lock && pip install --no-deps . && \
    DJANGO_SECRET_KEY=build DATABASE_URL=postgres://build/build \
    REDIS_URL=redis://build:6379/0 DJANGO_STATIC_ROOT=/app/static \
    python manage.py collectstatic --no-input -v 0

ENV DJANGO_STATIC_ROOT=/app/static
RUN useradd --system --home /app zoekt
USER zoekt
EXPOSE 8000
CMD ["gunicorn", "config.wsgi", "--bind", "0.0.0.0:8000", "--workers", "2", "--access-logfile", "-"]
