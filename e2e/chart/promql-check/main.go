// promql-check parses PromQL expressions with Prometheus' own parser and prints the
// metric names each one selects. Input: JSON lines {"name": "...", "expr": "..."} on
// stdin. Output: one tab-separated line per expression, "ok<TAB><name><TAB><metric>,..."
// or "error<TAB><name><TAB><message>"; exit status 1 if any expression failed to parse.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

type item struct {
	Name string `json:"name"`
	Expr string `json:"expr"`
}

func main() {
	promql := parser.NewParser(parser.Options{})
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	failed := false
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		var it item
		if err := json.Unmarshal([]byte(line), &it); err != nil {
			fmt.Printf("error\tinput\t%v\n", err)
			failed = true
			continue
		}
		expr, err := promql.ParseExpr(it.Expr)
		if err != nil {
			fmt.Printf("error\t%s\t%v\n", it.Name, strings.ReplaceAll(err.Error(), "\n", " "))
			failed = true
			continue
		}
		names := map[string]bool{}
		parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
			vs, ok := node.(*parser.VectorSelector)
			if !ok {
				return nil
			}
			if vs.Name != "" {
				names[vs.Name] = true
			}
			for _, m := range vs.LabelMatchers {
				if m.Name != labels.MetricName {
					continue
				}
				switch m.Type {
				case labels.MatchEqual:
					names[m.Value] = true
				case labels.MatchRegexp:
					for _, alt := range strings.Split(m.Value, "|") {
						names[alt] = true
					}
				}
			}
			return nil
		})
		list := make([]string, 0, len(names))
		for n := range names {
			list = append(list, n)
		}
		sort.Strings(list)
		fmt.Printf("ok\t%s\t%s\n", it.Name, strings.Join(list, ","))
	}
	if err := in.Err(); err != nil {
		fmt.Printf("error\tinput\t%v\n", err)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}
