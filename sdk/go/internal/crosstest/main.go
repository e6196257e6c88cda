// Command crosstest is the Go half of sdk/test.sh's cross-language check: it serves a
// Go executor for a Python client's tasks, and submits tasks for a Python executor.
//
//	crosstest serve  -portfile F -secret S -endpoint URL   executor for type cross_go
//	crosstest submit -endpoint URL -type cross_py -nonce N submit, wait for success
//
// Both sides derive the idempotency key from the same payload fields; each executor
// recomputes it with its own SDK and fails the task permanently when the keys differ,
// so a success proves signature, payload and key derivation agree across languages.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	asyncd "github.com/asyncd/asyncd/sdk/go"
)

// keyFields are the payload fields both languages derive the idempotency key from.
var keyFields = []string{"nonce", "amount", "text"}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: crosstest serve|submit [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "submit":
		err = submit(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "crosstest:", err)
		os.Exit(1)
	}
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "listen address")
	portfile := fs.String("portfile", "", "file to write the bound port to")
	secret := fs.String("secret", "", "signing secret")
	endpoint := fs.String("endpoint", asyncd.DefaultEndpoint, "asyncd API")
	_ = fs.Parse(args)

	c := asyncd.NewClient(asyncd.WithEndpoint(*endpoint), asyncd.WithSigningSecret(*secret))
	c.RegisterExecutor("cross_go", func(ctx context.Context, payload string) error {
		info, _ := asyncd.TaskInfoFrom(ctx)
		var p map[string]any
		if err := json.Unmarshal([]byte(payload), &p); err != nil {
			return asyncd.Permanent(err)
		}
		want, err := asyncd.IdempotencyKeyFrom(info.Type, json.RawMessage(payload), keyFields...)
		if err != nil {
			return asyncd.Permanent(err)
		}
		if info.IdempotencyKey != want {
			return asyncd.Permanent(fmt.Errorf("idempotency key %q, Go derives %q", info.IdempotencyKey, want))
		}
		if p["lang"] != "python" {
			return asyncd.Permanent(fmt.Errorf("payload %s did not come from the Python client", payload))
		}
		fmt.Printf("go executor ran %s (attempt %d) for the python client\n", info.ID, info.Attempt)
		return nil
	})
	l, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(l) }()
	if *portfile != "" {
		port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
		// Written whole then renamed, so a reader polling for it never sees it half-written.
		if err := os.WriteFile(*portfile+".tmp", []byte(port), 0o644); err != nil {
			return err
		}
		if err := os.Rename(*portfile+".tmp", *portfile); err != nil {
			return err
		}
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(ctx)
	return c.Shutdown(ctx)
}

func submit(args []string) error {
	fs := flag.NewFlagSet("submit", flag.ExitOnError)
	endpoint := fs.String("endpoint", asyncd.DefaultEndpoint, "asyncd API")
	taskType := fs.String("type", "cross_py", "task type")
	nonce := fs.Int64("nonce", time.Now().UnixNano(), "makes the payload unique")
	timeout := fs.Duration("timeout", 30*time.Second, "how long to wait for success")
	_ = fs.Parse(args)

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	c := asyncd.NewClient(asyncd.WithEndpoint(*endpoint), asyncd.WithServiceName("crosstest-go"))
	payload := map[string]any{"nonce": *nonce, "lang": "go", "amount": 12.5, "text": "Grüße 😀 \"q\"\n"}
	key, err := asyncd.IdempotencyKeyFrom(*taskType, payload, keyFields...)
	if err != nil {
		return err
	}
	res, err := c.Submit(ctx, &asyncd.Task{Type: *taskType, Payload: payload, IdempotencyKey: key})
	if err != nil {
		return err
	}
	for {
		st, err := c.Get(ctx, res.ID)
		if err != nil {
			return err
		}
		switch st.State {
		case asyncd.StateSucceeded:
			fmt.Printf("go client: task %s (%s) succeeded\n", res.ID, *taskType)
			return nil
		case asyncd.StateDead, asyncd.StateCancelled, asyncd.StateExpired:
			return fmt.Errorf("task %s is %s: %s", res.ID, st.State, st.LastError)
		}
		select {
		case <-ctx.Done():
			return errors.New("task " + res.ID + " did not succeed in time (state " + st.State + ")")
		case <-time.After(50 * time.Millisecond):
		}
	}
}
