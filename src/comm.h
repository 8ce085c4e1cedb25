/* comm: (to be written) */
