# The image of every tensortune service of docker-compose.yml: the Ray head with `tensortune serve`,
# and the CPU and GPU worker nodes (a worker needs the project too: Ray runs its agents there).
FROM python:3.11-slim

# libgomp1: the OpenMP runtime that XGBoost's wheel links against
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tensortune
COPY . .
# EXTRAS: the pyproject extras this image installs, none by default (the head and the CPU workers stay lean);
# docker-compose.yml builds the GPU worker's image with EXTRAS=cuda,cublas (CuPy, NVRTC and cudart for the
# candidates; cuBLAS for `tensortune bench kernels --target cuda`'s reference)
ARG EXTRAS=""
RUN pip install --no-cache-dir ".${EXTRAS:+[$EXTRAS]}"

# Ray refuses unauthenticated clients; the token itself comes from the environment (RAY_AUTH_TOKEN)
ENV RAY_AUTH_MODE=token
EXPOSE 8000 6379
CMD ["tensortune", "--help"]
