package main

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
)

// maxWebhookBody bounds a push webhook's body: GitHub caps its payloads at
// 25 MB, but a push of a few commits is a few KiB, and nothing of the body
// is used beyond checking its signature.
const maxWebhookBody = 1 << 20

// readWebhookSecret reads --webhook-secret-file: the shared secret, one
// line (a trailing newline is not part of it). An empty one is refused: it
// would let anybody trigger fetches.
func readWebhookSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--webhook-secret-file: %w", err)
	}
	b = []byte(strings.TrimRight(string(b), "\r\n"))
	if len(strings.TrimSpace(string(b))) == 0 {
		return nil, fmt.Errorf("--webhook-secret-file %s: empty secret", path)
	}
	return b, nil
}

// webhookHandler serves push webhooks: an authenticated POST pokes (a
// fetch, coalesced with any other pending one); anything else is refused
// and pokes nothing. Two ways to authenticate, by header:
//
//   - GitHub (and Gitea, Forgejo): X-Hub-Signature-256: sha256=<hex>, the
//     HMAC-SHA256 of the raw body keyed with the secret;
//   - GitLab: X-Gitlab-Token equal to the secret.
//
// Comparisons are constant-time. A body over maxWebhookBody is 413, a
// missing or wrong signature 401, a method other than POST 405. The
// payload itself is not read: a fetch asks the remote what is new, so a
// forged or stale payload can say nothing the fetch would believe.
func webhookHandler(secret []byte, poke func(), log *slog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a push event", http.StatusMethodNotAllowed)
			return
		}
		if r.ContentLength > maxWebhookBody {
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			log.Warn("webhook refused: body too large", "remote", r.RemoteAddr, "bytes", r.ContentLength)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBody))
		var tooLarge *http.MaxBytesError
		switch {
		case errors.As(err, &tooLarge):
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			log.Warn("webhook refused: body too large", "remote", r.RemoteAddr)
			return
		case err != nil:
			http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
			return
		}
		if why := checkWebhookAuth(secret, r.Header, body); why != "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			log.Warn("webhook refused: "+why, "remote", r.RemoteAddr)
			return
		}
		if ev := r.Header.Get("X-GitHub-Event"); ev == "ping" {
			fmt.Fprintln(w, "pong")
			return
		}
		poke()
		log.Info("webhook: fetch requested", "remote", r.RemoteAddr, "event", webhookEvent(r.Header))
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprintln(w, "fetch queued")
	})
}

// checkWebhookAuth says why a request is not authenticated ("" when it
// is): a GitHub signature when there is one, else a GitLab token.
func checkWebhookAuth(secret []byte, h http.Header, body []byte) string {
	if sig := h.Get("X-Hub-Signature-256"); sig != "" {
		hexSum, ok := strings.CutPrefix(sig, "sha256=")
		got, err := hex.DecodeString(hexSum)
		if !ok || err != nil {
			return "malformed X-Hub-Signature-256 (want sha256=<hex>)"
		}
		mac := hmac.New(sha256.New, secret)
		mac.Write(body)
		if !hmac.Equal(got, mac.Sum(nil)) {
			return "wrong X-Hub-Signature-256"
		}
		return ""
	}
	if tok := h.Get("X-Gitlab-Token"); tok != "" {
		// Compare digests, so that not even the secret's length shows in
		// the time taken.
		a, b := sha256.Sum256([]byte(tok)), sha256.Sum256(secret)
		if !hmac.Equal(a[:], b[:]) {
			return "wrong X-Gitlab-Token"
		}
		return ""
	}
	return "no X-Hub-Signature-256 or X-Gitlab-Token"
}

// webhookEvent names the event for the log, whichever forge sent it.
func webhookEvent(h http.Header) string {
	for _, k := range []string{"X-GitHub-Event", "X-Gitlab-Event", "X-Gitea-Event"} {
		if v := h.Get(k); v != "" {
			return v
		}
	}
	return ""
}
