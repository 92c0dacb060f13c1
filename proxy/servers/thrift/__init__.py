"""The Thrift adapter: DDMQ's consumerProxy.thrift served over a framed binary socket."""
