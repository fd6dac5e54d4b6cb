.PHONY: demo test build lint

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
