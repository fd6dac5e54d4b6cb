.PHONY: demo test build lint deb

# One-command demo: private systemd user manager + agent + put/change/rm.
demo:
	bash contrib/demo.sh

# Every test; what .ci/run runs.
test:
	go test ./...

build:
	go build -o bin/agentd ./cmd/agentd

lint:
	gofmt -l . && go vet ./... && staticcheck ./...

# The Debian package, dist/agentd_<version>_<arch>.deb (internal/pkgdeb):
# version from git describe; `apt install ./dist/agentd_*.deb`.
deb:
	go run ./cmd/mkdeb -o dist
