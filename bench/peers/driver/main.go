package main

import (
	"context"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

var _ = river.NewWorkers
var _ = riverpgxv5.New
var _ = rivermigrate.New
var _ = pgxpool.New
var _ = context.Background

func main() {}
