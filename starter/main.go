// Command mcpsync is the command line of mcpsync: register sources, subscribe and
// unsubscribe, inspect state and read accepted versions. See `mcpsync help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/mcpsync/mcpsync/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, cli.Env{Stdout: os.Stdout, Stderr: os.Stderr}, os.Args[1:])
	stop()
	os.Exit(int(code))
}
