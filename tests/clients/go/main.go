// One produce to a topic through a Go client (franz-go or sarama), for scripts/client-errors:
// metadata for the topic first, then one record to partition 0; prints what the application gets.
//
// Usage: kmclient franz-go|sarama BOOTSTRAP TOPIC plain|idem
// Output, one line each: RESULT OK|ERROR, CLASS (the error's Go type and, for a Kafka error, its
// name and code), TEXT (err.Error()), MS (send to the result).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

func report(err error, t0 time.Time, class string) {
	ms := float64(time.Since(t0).Microseconds()) / 1000
	if err == nil {
		fmt.Println("RESULT OK")
	} else {
		fmt.Println("RESULT ERROR")
		fmt.Println("CLASS " + class)
		fmt.Println("TEXT " + strings.ReplaceAll(err.Error(), "\n", " "))
	}
	fmt.Printf("MS %.1f\n", ms)
}

func franz(bootstrap, topic, mode string) {
	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(bootstrap, ",")...),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.RecordDeliveryTimeout(30 * time.Second),
		kgo.ProduceRequestTimeout(10 * time.Second),
	}
	if mode == "plain" {
		opts = append(opts, kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		fmt.Println("SETUP " + err.Error())
		os.Exit(2)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	if _, err := req.RequestWith(ctx, cl); err != nil {
		fmt.Println("SETUP metadata: " + err.Error())
		os.Exit(2)
	}
	t0 := time.Now()
	err = cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte("to-mirror")}).FirstErr()
	class := fmt.Sprintf("%T", err)
	var ke *kerr.Error
	if errors.As(err, &ke) {
		class += fmt.Sprintf(" %s (%d, retriable %v)", ke.Message, ke.Code, ke.Retriable)
	}
	report(err, t0, class)
}

func saramaProduce(bootstrap, topic, mode string) {
	cfg := sarama.NewConfig()
	cfg.ClientID = "kmirror-client-errors"
	cfg.Producer.Return.Successes = true
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	cfg.Producer.Timeout = 10 * time.Second
	if mode == "plain" {
		cfg.Producer.RequiredAcks = sarama.WaitForLocal
	} else {
		cfg.Producer.Idempotent = true
		cfg.Producer.RequiredAcks = sarama.WaitForAll
		cfg.Net.MaxOpenRequests = 1
	}
	client, err := sarama.NewClient(strings.Split(bootstrap, ","), cfg)
	if err != nil {
		fmt.Println("SETUP " + err.Error())
		os.Exit(2)
	}
	defer client.Close()
	if err := client.RefreshMetadata(topic); err != nil {
		fmt.Println("SETUP metadata: " + err.Error())
		os.Exit(2)
	}
	p, err := sarama.NewSyncProducerFromClient(client)
	if err != nil {
		fmt.Println("SETUP " + err.Error())
		os.Exit(2)
	}
	defer p.Close()
	t0 := time.Now()
	_, _, err = p.SendMessage(&sarama.ProducerMessage{Topic: topic, Partition: 0, Value: sarama.StringEncoder("to-mirror")})
	class := fmt.Sprintf("%T", err)
	var ke sarama.KError
	if errors.As(err, &ke) {
		class += fmt.Sprintf(" (%d)", int16(ke))
	}
	report(err, t0, class)
}

func main() {
	if len(os.Args) != 5 {
		fmt.Fprintln(os.Stderr, "usage: kmclient franz-go|sarama BOOTSTRAP TOPIC plain|idem")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "franz-go":
		franz(os.Args[2], os.Args[3], os.Args[4])
	case "sarama":
		saramaProduce(os.Args[2], os.Args[3], os.Args[4])
	default:
		fmt.Fprintln(os.Stderr, "unknown client "+os.Args[1])
		os.Exit(2)
	}
}
