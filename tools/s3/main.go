// Command s3server is the S3 server that benchmarks/checkpoint_io.py compares the checkpoint
// store against besides moto: gofakes3 (MIT) over a folder on disk, so multi-GiB objects are
// files, not memory, and a ranged GET reads only its range (moto's reads the whole object).
//
//	s3server -dir DIR [-addr 127.0.0.1:0] [-bucket NAME]
//
// It prints "listening on HOST:PORT" once it accepts connections (-addr's port 0: a free
// one), and serves until it is killed. Built by build.sh beside it; see README.md.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"runtime/debug"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3afero"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:0", "where to listen (loopback only)")
	dir := flag.String("dir", "", "folder that holds the buckets (created if missing)")
	bucket := flag.String("bucket", "", "a bucket to create at start (optional)")
	flag.Parse()
	if *dir == "" {
		log.Fatal("s3server: -dir is required (the folder that holds the buckets)")
	}
	host, _, err := net.SplitHostPort(*addr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("s3server: -addr %q: give a loopback address such as 127.0.0.1:0", *addr)
	}
	// gofakes3 holds a multipart upload's parts in memory, then joins them into one buffer
	// the object's size: collect sooner than Go's default (twice the live heap) so a 4 GiB
	// upload peaks near 8 GiB, not 16.
	debug.SetGCPercent(20)
	fs, err := s3afero.FsPath(*dir, s3afero.FsPathCreateAll)
	if err != nil {
		log.Fatalf("s3server: -dir %q: %v", *dir, err)
	}
	backend, err := s3afero.MultiBucket(fs)
	if err != nil {
		log.Fatalf("s3server: %v", err)
	}
	if *bucket != "" {
		if err := backend.CreateBucket(*bucket); err != nil && !gofakes3.IsAlreadyExists(err) {
			log.Fatalf("s3server: bucket %q: %v", *bucket, err)
		}
	}
	faker := gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog()))
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatalf("s3server: %v", err)
	}
	fmt.Printf("listening on %s\n", ln.Addr())
	os.Stdout.Sync()
	log.Fatal(http.Serve(ln, faker.Server()))
}
