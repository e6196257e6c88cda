module github.com/asyncd/asyncd/sdk/go

go 1.22
