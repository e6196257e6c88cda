// Command peers is the side-by-side benchmark behind `e2e/bench.sh peers`: it runs the
// same workloads against asyncd (`asyncd dev` on SQLite, and `asyncd api` + `asyncd
// dispatcher` on PostgreSQL) and against River, graphile-worker and BullMQ, every
// system's handler POSTing each task to one no-op HTTP executor, and prints one table.
//
//	peers run      [flags]   the benchmark (see -h)
//	peers executor [flags]   the no-op HTTP executor (started by run)
//	peers river    setup|insert|work [flags]   the River peer (started by run)
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: peers run|executor|river ...")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = runBench(os.Args[2:])
	case "executor":
		err = runExecutor(os.Args[2:])
	case "river":
		err = runRiver(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}
