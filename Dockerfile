# Image of the mcpsync worker, CLI and demo server for docker-compose.yml.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -o /out/mcpsync ./starter \
 && CGO_ENABLED=0 go build -o /out/mcpsync-worker ./worker \
 && CGO_ENABLED=0 go build -o /out/mcpsync-demo-server ./cmd/mcpsync-demo-server

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
USER nobody
CMD ["mcpsync-worker"]
